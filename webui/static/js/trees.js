// Transformations of d3-flame-graph trees ({ name, value, children }). No DOM: Node runs this
// module as it is in the tests (tests/webui/trees_check.mjs).

// The tree without the samples of threads that were waiting (wall mode's [waiting] frames),
// every ancestor's value reduced by what was taken out below it: what the program did while
// it ran.
export function withoutWaiting (node) {
  const children = []
  let value = node.value
  for (const child of node.children || []) {
    if (child.name === '[waiting]') { value -= child.value; continue }
    const kept = withoutWaiting(child)
    value -= child.value - kept.value
    if (kept.value > 0) children.push(kept)
  }
  return { ...node, value, children }
}

// Chains of frames that every sample below them passes through (each frame the only child of
// the one above, holding all of its samples: a launcher, a server's accept loop, an import
// stack), `min` frames or longer, drawn as one frame naming its two ends; `frames` keeps
// every name, so search, links and tooltips still see them. Such chains put the graph's
// answer screens below its top.
export function collapseChains (node, min = 4) {
  const children = (node.children || []).map(child => {
    const chain = [child]
    let last = child
    while (last.children && last.children.length === 1 && last.children[0].value === last.value) {
      last = last.children[0]
      chain.push(last)
    }
    const below = collapseChains(last, min)
    if (chain.length < min) return chain.length === 1 ? below : { ...child, children: [relink(chain.slice(1), below)] }
    return {
      ...below,
      name: `${chain[0].name} … ${last.name}`,
      frames: chain.map(frame => frame.name)
    }
  })
  return { ...node, children }
}

// A short chain kept as it was, over the collapsed tree below its last frame.
function relink (chain, last) {
  if (chain.length === 1) return last
  return { ...chain[0], children: [relink(chain.slice(1), last)] }
}
