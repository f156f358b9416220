// Colours of a differential flamegraph (the compare page's, and a route's slowest requests
// against all of it): a frame's colour is the change of its own (self) share of each side's
// total, red more time in B, blue less, full colour at the largest change; so the frames whose
// own time changed stand out, not every caller above them (whose total changed with theirs).

const NEUTRAL = [221, 221, 221]
const MORE = [224, 60, 40]
const LESS = [40, 110, 224]

// Sets each node's self_delta (its own samples' share in B minus in A) over the tree of
// samples_a and samples_b; returns the largest one in size below the root.
export function markSelfDeltas (tree, totalA, totalB) {
  let largest = 1e-9
  const visit = node => {
    const own = key => node[key] - node.children.reduce((sum, child) => sum + child[key], 0)
    const a = totalA ? own('samples_a') / totalA : 0
    const b = totalB ? own('samples_b') / totalB : 0
    node.self_delta = b - a
    if (node !== tree) largest = Math.max(largest, Math.abs(node.self_delta))
    node.children.forEach(visit)
  }
  visit(tree)
  return largest
}

// The colour of a change `delta` on a scale whose full colour is `largest`.
export function deltaColor (delta, largest) {
  const strength = Math.sqrt(Math.min(1, Math.abs(delta) / largest))
  const target = delta > 0 ? MORE : LESS
  const rgb = NEUTRAL.map((c, i) => Math.round(c + (target[i] - c) * strength))
  return `rgb(${rgb.join(',')})`
}
