// The flamegraph page: timeline, filters, flamegraph, search and the top-functions table.

import { $, body, count, pct, regexEscape, showStatus } from './util.js'
import { api, graphQuery, params, preloadedGraphQuery, selectionParams, update } from './state.js'
import { refreshFilters, setupFilters } from './filters.js'
import { drawTimeline } from './timeline.js'
import { createFlame } from './flame.js'
import { sortableTable } from './table.js'

let total = 0

const flame = createFlame($('chart'), {
  label: node => `${node.data.name}\n${count(node.data.value)} samples, ` +
    `${pct(total ? node.data.value / total : 0)} of total`,
  details: $('details'),
  onSearch: text => { $('search-result').textContent = text },
  onFocus: node => {
    const path = flame.pathOf(node)
    update(p => p.set('focus', path), { push: false })
  }
})

const table = sortableTable($('top'), [
  { key: 'name', format: r => r.name, className: () => 'name' },
  { key: 'self', format: r => count(r.self), className: () => 'num' },
  { key: 'self_share', format: r => pct(r.self_share), className: () => 'num' },
  { key: 'total', format: r => count(r.total), className: () => 'num' },
  { key: 'total_share', format: r => pct(r.total_share), className: () => 'num' }
], row => focusFunction(row.name))

function focusFunction (name) {
  const term = `^${regexEscape(name)}$`
  $('search').value = term
  flame.search(term)
  const node = flame.widest(name)
  if (node) flame.zoomTo(node)
  update(p => { p.set('search', term); if (node) p.set('focus', flame.pathOf(node)) })
}

function exportLinks (query) {
  for (const format of ['folded', 'speedscope', 'pprof']) {
    $(`export-${format}`).href = `${body.dataset.api}/${format}?${query}`
  }
}

let loading = 0
let lastTree = null
// The first load's graph request is the one the browser started from the page's head.
let preloaded = preloadedGraphQuery()

function render () {
  const p = params()
  if (!total) {
    flame.clear('No samples in this window for these filters: widen the window or drop a filter.')
    return
  }
  flame.draw(lastTree, { icicle: $('icicle').checked })
  if (p.get('search')) flame.search(p.get('search'))
  const focus = flame.findPath(p.get('focus'))
  if (focus) flame.zoomTo(focus)
}

async function load () {
  const ticket = ++loading
  const p = params()
  const query = selectionParams(p)
  $('search').value = p.get('search') || ''
  $('icicle').checked = p.get('icicle') === '1'
  exportLinks(query)
  showStatus('')
  body.dataset.state = 'loading'
  try {
    const graphParams = preloaded || graphQuery(p)
    preloaded = null
    const graph = await api('flamegraph', graphParams)
    if (ticket !== loading) return // a newer load started meanwhile
    // The graph is what people wait for: the timeline is asked for once the graph has come
    // (both would compete for the server), and drawn after the graph.
    const timelineRequest = api('timeline', query)
    timelineRequest.catch(() => {}) // awaited below, unless drawing the graph fails first
    total = graph.total
    const pruned = graph.pruned_nodes
      ? `; ${count(graph.pruned_samples)} samples in ${graph.pruned_nodes} [pruned] frames (max_nodes=${graph.max_nodes})`
      : ''
    $('summary').textContent = `${count(graph.total)} samples, ${graph.nodes} frames, ` +
      `${graph.resolution} s buckets${pruned}`
    lastTree = graph.tree
    render()
    // Where benchmarks read the time from navigation to a drawn flamegraph.
    window.requestAnimationFrame(() => performance.mark('flamegraph-drawn'))
    const timeline = await timelineRequest
    if (ticket !== loading) return
    drawTimeline($('timeline'), timeline, (from, to) => {
      update(q => { q.set('from', String(from)); q.set('to', String(to)); q.delete('focus') })
      load()
    })
    // The table comes second: the graph is what people wait for.
    const top = await api('top', query)
    if (ticket !== loading) return
    table.set(top.functions, 'self')
    body.dataset.state = 'ready'
    refreshFilters(graph.selection)
  } catch (error) {
    if (ticket !== loading) return
    showStatus(error.message)
    body.dataset.state = 'error'
    refreshFilters(null)
  }
}

setupFilters(load)
$('search').addEventListener('input', event => {
  flame.search(event.target.value)
  update(p => p.set('search', event.target.value), { push: false })
})
$('reset-zoom').addEventListener('click', () => {
  flame.resetZoom()
  update(p => p.delete('focus'), { push: false })
})
$('icicle').addEventListener('change', event => {
  update(p => p.set('icicle', event.target.checked ? '1' : ''), { push: false })
  if (lastTree) render()
})
load()
