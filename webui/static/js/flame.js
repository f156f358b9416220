// A d3-flame-graph chart with our labels, search, focus paths and colours.

/* global d3 */

import { compileSearch, pct } from './util.js'
import { displayFrames, foldedStack, shownName } from './frames.js'

// d3-flame-graph 5.x's UMD bundle defines `flamegraph` as a namespace whose `default` is the
// chart factory; 4.x defined the factory itself.
function factory () {
  const ns = window.flamegraph
  if (!ns) throw new Error('d3-flame-graph is not loaded: run make setup (npm ci and webui/build_assets.py)')
  return typeof ns === 'function' ? ns : ns.default
}

function tooltip () {
  const ns = window.flamegraph
  const make = ns && ns.tooltip && ns.tooltip.defaultFlamegraphTooltip
  return make ? make() : null // .text() below: the tooltip shows text, never markup
}

// Options: label(node) -> text, color(node) -> css colour, onFocus(node), onSearch(text).
export function createFlame (container, options) {
  let chart = null
  let root = null
  let searchTerm = ''

  function searchMatch (node, term) {
    const pattern = compileSearch(term)
    if (!(pattern instanceof RegExp)) return false
    return pattern.test(node.data.name) || (node.data.frames || []).some(frame => pattern.test(frame))
  }

  // order: 'name' (as the server sends it) or 'heavy' (left-heavy: heaviest child first).
  function draw (tree, { icicle = false, order = 'name' } = {}) {
    if (chart) chart.destroy()
    container.replaceChildren()
    const tip = tooltip()
    chart = factory()()
      .width(Math.max(300, container.clientWidth))
      .cellHeight(18)
      .minFrameSize(1)
      .transitionDuration(250)
      .inverted(icicle)
      .selfValue(false)
      .getName(node => shownName(node.data.name))
      .label(options.label)
      .setSearchMatch(searchMatch)
      .setSearchHandler((results, sum, total) => {
        if (options.onSearch) options.onSearch(searchSummary(results, sum, total))
      })
      .onClick(node => { if (options.onFocus) options.onFocus(node) })
    if (order === 'heavy') chart.sort((a, b) => b.data.value - a.data.value)
    if (tip) chart.tooltip(tip.text(options.label))
    if (options.details) chart.setDetailsElement(options.details)
    if (options.color) chart.setColorMapper((node, original) => node.highlight ? original : options.color(node))
    d3.select(container).datum(tree).call(chart)
    root = d3.select(container).datum()
    if (searchTerm) search(searchTerm)
    return root
  }

  function searchSummary (results, sum, total) {
    const pattern = compileSearch(searchTerm)
    if (!searchTerm) return ''
    if (pattern instanceof Error) return `invalid regex: ${pattern.message}`
    const frames = matchingFrames(results, pattern).size
    return `${frames} matching function${frames === 1 ? '' : 's'}: ${pct(total ? sum / total : 0)} of total`
  }

  // The distinct frames that match: a collapsed chain counts each of its frames that does
  // (or its drawn name, where only that does).
  function matchingFrames (results, pattern) {
    const found = new Set()
    for (const { data } of results) {
      const hits = (data.frames || []).filter(frame => pattern.test(frame))
      for (const frame of hits.length ? hits : [data.name]) found.add(frame)
    }
    return found
  }

  function search (term) {
    searchTerm = term || ''
    if (!chart) return
    if (searchTerm) chart.search(searchTerm)
    else { chart.clear(); if (options.onSearch) options.onSearch('') }
  }

  // The frames from the root's child down to `node`, escaped and joined as in folded stacks
  // (a collapsed chain stands for all of its frames).
  function pathOf (node) {
    return foldedStack(node.ancestors().reverse().slice(1).flatMap(n => n.data.frames || [n.data.name]))
  }

  // The node a path names; a path that ends inside a collapsed chain names the chain.
  function findPath (path) {
    if (!root || !path) return null
    const frames = displayFrames(path)
    let node = root
    let i = 0
    while (i < frames.length) {
      const next = (node.children || []).find(child => matches(child.data, frames, i))
      if (!next) return null
      i += next.data.frames ? next.data.frames.length : 1
      node = next
    }
    return node
  }

  function matches (data, frames, at) {
    if (!data.frames) return data.name === frames[at]
    const rest = frames.slice(at, at + data.frames.length)
    return rest.every((frame, k) => frame === data.frames[k])
  }

  // The widest frame of that name: where a click in the function table zooms to.
  function widest (name) {
    let best = null
    if (root) {
      root.each(node => {
        if (node.data.name === name && (!best || node.value > best.value)) best = node
      })
    }
    return best
  }

  // Replaces the graph by a message (an empty window, for instance).
  function clear (message) {
    if (chart) chart.destroy()
    chart = null
    root = null
    container.replaceChildren()
    const note = document.createElement('p')
    note.className = 'empty'
    note.textContent = message
    container.append(note)
  }

  return {
    draw,
    clear,
    search,
    pathOf,
    findPath,
    widest,
    zoomTo (node) { if (chart && node) chart.zoomTo(node) },
    resetZoom () { if (chart) chart.resetZoom() },
    get root () { return root }
  }
}
