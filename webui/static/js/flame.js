// A d3-flame-graph chart with our labels, search, focus paths and colours.

/* global d3 */

import { compileSearch, escapeFrame, pct, unescapeFrame } from './util.js'

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
    return pattern instanceof RegExp && pattern.test(node.data.name)
  }

  function draw (tree, { icicle = false } = {}) {
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
      .label(options.label)
      .setSearchMatch(searchMatch)
      .setSearchHandler((results, sum, total) => {
        if (options.onSearch) options.onSearch(searchSummary(results, sum, total))
      })
      .onClick(node => { if (options.onFocus) options.onFocus(node) })
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
    const frames = new Set(results.map(r => r.data.name)).size
    return `${frames} matching function${frames === 1 ? '' : 's'}: ${pct(total ? sum / total : 0)} of total`
  }

  function search (term) {
    searchTerm = term || ''
    if (!chart) return
    if (searchTerm) chart.search(searchTerm)
    else { chart.clear(); if (options.onSearch) options.onSearch('') }
  }

  // The frames from the root's child down to `node`, escaped and joined as in folded stacks.
  function pathOf (node) {
    return node.ancestors().reverse().slice(1).map(n => escapeFrame(n.data.name)).join(';')
  }

  function findPath (path) {
    if (!root || !path) return null
    let node = root
    for (const frame of path.split(';').map(unescapeFrame)) {
      node = (node.children || []).find(child => child.data.name === frame)
      if (!node) return null
    }
    return node
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
