// The flamegraph page: timeline, filters, flamegraph, search and the top-functions table.

import { $, body, compileSearch, count, counted, el, formatTime, isoTime, pct, regexEscape, showStatus } from './util.js'
import { api, graphQuery, labelParam, params, preloadedGraphQuery, selectionParams, update } from './state.js'
import { currentLabelValues, refreshFilters, setupFilters } from './filters.js'
import { drawTimeline, splitLegend } from './timeline.js'
import { createFlame } from './flame.js'
import { sortableTable } from './table.js'
import { shownName } from './frames.js'
import { showNoSeries, showSeries } from './series.js'
import { clearSandwich, showSandwich } from './sandwich.js'
import { collapseChains, withoutWaiting } from './trees.js'

let total = 0
let interval = 0 // seconds one sample stands for, as the samplers said
let maxNodes = 0 // the frames the graph on screen was pruned to

// A duration as people read it: 850 ms, 12.4 s, 3.2 min, 1.5 h.
function seconds (value) {
  if (value < 1) return `${(value * 1000).toFixed(0)} ms`
  if (value < 120) return `${value.toFixed(1)} s`
  if (value < 7200) return `${(value / 60).toFixed(1)} min`
  return `${(value / 3600).toFixed(1)} h`
}

// A collapsed chain's tooltip lists its frames (the first and last 10 of a longer one).
function chainFrames (frames) {
  if (!frames) return ''
  const shown = frames.length <= 20 ? frames : [...frames.slice(0, 10), '…', ...frames.slice(-10)]
  return `\n${frames.length} frames every sample here passes through (untick "collapse chains" to draw them):\n` +
    shown.map(shownName).join('\n')
}

const flame = createFlame($('chart'), {
  label: node => `${shownName(node.data.name)}\n${count(node.data.value)} samples` +
    (interval ? ` = ${seconds(node.data.value * interval)}` : '') +
    `, ${pct(total ? node.data.value / total : 0)} of total` + chainFrames(node.data.frames),
  details: $('details'),
  onSearch: text => { $('search-result').textContent = text },
  onFocus: node => {
    const path = flame.pathOf(node)
    update(p => p.set('focus', path), { push: false })
    if (!node.parent) return
    const clicked = clickedFunction(node)
    if (clicked.name === undefined) {
      update(p => p.delete('function'), { push: false })
      showNoSeries($('series'), clicked.why)
      clearSandwich($('sandwich'))
      return
    }
    update(p => p.set('function', clicked.name), { push: false })
    showSeries($('series'), clicked.name, selectionParams(params()))
    showSandwich($('sandwich'), clicked.name, selectionParams(params()))
  }
})

// The function a clicked frame stands for ({ name }), or why it stands for none ({ why }):
// some frames are made by the server or this page, and no stack holds their names.
function clickedFunction (node) {
  const data = node.data
  if (params().get('order') === 'time' && node.depth === 1) {
    return { why: `${data.name} is a time step of the time-ordered graph, not a function: click a frame in it for that function's share over time and its callers and callees.` }
  }
  // A collapsed chain: its last frame, the function the work below it was called from.
  if (data.frames) return { name: data.frames[data.frames.length - 1] }
  // The server's remainder of callees not drawn (a leaf: a real frame of that name that
  // called something has children).
  if (data.name === '[pruned]' && !(data.children && data.children.length)) {
    return { why: `[pruned] is not a function: it holds the ${count(data.value)} samples of the callees left out to draw at most ${count(maxNodes)} frames. Search the table for a function, or ask for more frames with max_nodes= in the URL.` }
  }
  return { name: data.name }
}

const table = sortableTable($('top'), [
  { key: 'name', format: r => shownName(r.name), className: () => 'name' },
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
  for (const format of ['folded', 'speedscope', 'pprof', 'gecko']) {
    $(`export-${format}`).href = `${body.dataset.api}/export?format=${format}&${query}`
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
  let tree = $('hide-waiting').checked ? withoutWaiting(lastTree) : lastTree
  if ($('collapse-chains').checked) {
    // In time order the time steps stay frames of their own; chains collapse below them.
    tree = p.get('order') === 'time'
      ? { ...tree, children: tree.children.map(step => collapseChains(step)) }
      : collapseChains(tree)
  }
  if (!tree.value) {
    flame.clear('Every sample of this window was waiting: untick "hide waiting" to see where.')
    return
  }
  flame.draw(tree, { icicle: $('icicle').checked, order: $('order').value })
  if (p.get('search')) flame.search(p.get('search'))
  const focus = flame.findPath(p.get('focus'))
  if (focus) flame.zoomTo(focus)
}

let searching = null // the table's refetch, a moment after the search was typed
async function load () {
  const ticket = ++loading
  clearTimeout(searching) // this load asks for the table itself
  const p = params()
  const query = selectionParams(p)
  $('search').value = p.get('search') || ''
  $('icicle').checked = p.get('icicle') === '1'
  $('hide-waiting').checked = p.get('waiting') === 'hide'
  $('collapse-chains').checked = p.get('chains') !== 'all'
  $('order').value = ['heavy', 'time'].includes(p.get('order')) ? p.get('order') : 'name'
  exportLinks(query)
  showStatus('')
  body.dataset.state = 'loading'
  try {
    const graphParams = preloaded || graphQuery(p)
    preloaded = null
    const graph = p.get('order') === 'time'
      ? inTimeOrder(await api('time-order', graphQuery(p)))
      : await api('flamegraph', graphParams)
    if (ticket !== loading) return // a newer load started meanwhile
    // The graph is what people wait for: the timeline is asked for once the graph has come
    // (both would compete for the server), and drawn after the graph.
    const split = p.get('split')
    const timelineRequest = api('timeline', split ? `${query}&split=${encodeURIComponent(split)}` : query)
    timelineRequest.catch(() => {}) // awaited below, unless drawing the graph fails first
    total = graph.total
    interval = graph.interval || 0
    maxNodes = graph.max_nodes
    const pruned = graph.pruned_nodes
      ? `; ${count(graph.pruned_samples)} samples in ${graph.pruned_nodes} [pruned] frames (max_nodes=${graph.max_nodes})`
      : ''
    $('summary').textContent = `${counted(graph.total, 'sample')}, ${counted(graph.nodes, 'frame')}, ` +
      `${graph.resolution} s buckets${pruned}`
    lastTree = graph.tree
    showWindowRead(graph)
    render()
    // A link may name a function (the findings page does): its share over time and sandwich.
    const named = p.get('function')
    if (named && total) {
      showSeries($('series'), named, query)
      showSandwich($('sandwich'), named, query)
    }
    // Where benchmarks read the time from navigation to a drawn flamegraph.
    window.requestAnimationFrame(() => performance.mark('flamegraph-drawn'))
    const timeline = await timelineRequest
    if (ticket !== loading) return
    drawTimeline($('timeline'), timeline, (from, to) => {
      update(q => { q.set('from', String(from)); q.set('to', String(to)); q.delete('focus') })
      load()
    })
    splitLegend($('split-legend'), timeline, value => {
      const key = timeline.split
      update(q => {
        if (['service', 'host', 'instance'].includes(key)) q.set(key, value)
        else q.append('label', labelParam(key, value))
        q.delete('split'); q.delete('focus')
      })
      load()
    })
    // The table comes second: the graph is what people wait for.
    await loadFunctions(query, ticket)
    if (ticket !== loading) return
    body.dataset.state = 'ready'
    if ($('search').value !== functionsTerm) searchTable() // typed while the table loaded
    refreshFilters(graph.selection).then(offerSplits)
  } catch (error) {
    if (ticket !== loading) return
    showStatus(error.message)
    // Nothing stale stays on screen looking like an answer: the graph, its table and its
    // summary make way for the error and what to do.
    total = 0
    lastTree = null
    flame.clear(`${error.message}. Change the window or filters above, or reload the page.`)
    table.set([])
    $('summary').textContent = ''
    $('window-read').replaceChildren()
    body.dataset.state = 'error'
    refreshFilters(null)
  }
}

// The window the server read, as an absolute link: the same graph whenever it is opened.
function showWindowRead (graph) {
  const seconds = graph.seconds === undefined ? '' : ` (${graph.seconds.toFixed(2)} s of ${graph.selection.mode} time)`
  const { read_from: from, read_to: to } = graph.selection
  const p = params()
  p.set('from', isoTime(from))
  p.set('to', isoTime(to))
  const link = el('a', { id: 'permalink', href: `?${p}` }, 'link to this window')
  $('window-read').replaceChildren(
    `window read ${isoTime(from)} → ${isoTime(to)} (whole buckets), ` +
      `${count(graph.total)} samples${seconds} · `, link)
}

// The time-ordered graph: its top frames are time steps, named in the page's time zone (the
// names sort as the times do).
function inTimeOrder (graph) {
  for (const step of graph.tree.children) {
    if (step.t !== null && step.t !== undefined) step.name = formatTime(step.t) // not [pruned]
  }
  graph.resolution = graph.step
  return graph
}

// A graph redrawn to the page's width when the window is resized.
let resizing = null
window.addEventListener('resize', () => {
  clearTimeout(resizing)
  resizing = setTimeout(() => { if (lastTree && total) render() }, 150)
})

setupFilters(load)
// The table beside the graph lists what the search matches (everything when it is empty).
// Plain text (texts separated by |) is asked of the server, which ranks every function that
// matches (a caller with no self samples, far below the top rows, is found too); a regular
// expression filters the top rows here. While the server answers, the rows at hand are
// filtered.
let functions = []
let functionsAsked = 0
let functionsTerm = '' // the search the rows at hand were asked with
function showFunctions () {
  const pattern = compileSearch($('search').value)
  table.set(pattern instanceof RegExp ? functions.filter(f => pattern.test(f.name)) : functions, 'self')
}

async function loadFunctions (query, ticket) {
  const asked = ++functionsAsked
  const term = $('search').value
  const plain = /^[^\\^$*+?()[\]{}]*$/.test(term) // dots and bars aside, no regex syntax
  const search = term && plain ? `&search=${encodeURIComponent(term)}` : ''
  let top
  try {
    top = await api('top', query + search)
  } catch (error) {
    if (!search) throw error
    top = await api('top', query) // a pattern only this browser takes: filtered here
  }
  if (ticket !== loading || asked !== functionsAsked) return
  functions = top.functions
  functionsTerm = term
  showFunctions()
}

// The table asked again for the search typed (once the page has loaded: a load asks itself).
function searchTable () {
  clearTimeout(searching)
  if (total && body.dataset.state === 'ready') {
    loadFunctions(selectionParams(params()), loading).catch(error => showStatus(error.message))
  }
}

$('search').addEventListener('input', event => {
  flame.search(event.target.value)
  showFunctions()
  update(p => p.set('search', event.target.value), { push: false })
  clearTimeout(searching)
  searching = setTimeout(searchTable, 300)
})
// Keys: / searches, Esc resets the zoom (and leaves the search box).
document.addEventListener('keydown', event => {
  const typing = ['INPUT', 'SELECT', 'TEXTAREA'].includes(document.activeElement.tagName)
  if (event.key === '/' && !typing) {
    event.preventDefault()
    $('search').focus()
  } else if (event.key === 'Escape') {
    if (typing) document.activeElement.blur()
    flame.resetZoom()
    update(p => p.delete('focus'), { push: false })
  }
})
$('reset-zoom').addEventListener('click', () => {
  flame.resetZoom()
  update(p => p.delete('focus'), { push: false })
})
// The keys the timeline can be split by: service, host, instance and the window's labels.
async function offerSplits () {
  const select = $('split')
  const current = params().get('split') || ''
  const keys = ['service', 'host', 'instance', ...Object.keys(currentLabelValues()).filter(
    k => !['service', 'host', 'instance'].includes(k)).sort()]
  select.replaceChildren(new Option('nothing', ''), ...keys.map(k => new Option(shownName(k), k)))
  select.value = keys.includes(current) ? current : ''
}
$('split').addEventListener('change', event => {
  update(p => p.set('split', event.target.value), { push: false })
  load()
})
$('hide-waiting').addEventListener('change', event => {
  update(p => p.set('waiting', event.target.checked ? 'hide' : ''), { push: false })
  if (lastTree && total) render()
})
$('collapse-chains').addEventListener('change', event => {
  update(p => p.set('chains', event.target.checked ? '' : 'all'), { push: false })
  if (lastTree && total) render()
})
$('order').addEventListener('change', event => {
  const wasTime = params().get('order') === 'time'
  update(p => p.set('order', event.target.value === 'name' ? '' : event.target.value), { push: false })
  if (wasTime || event.target.value === 'time') { load(); return } // another graph from the server
  if (lastTree && total) render()
})
$('icicle').addEventListener('change', event => {
  update(p => p.set('icicle', event.target.checked ? '1' : ''), { push: false })
  if (lastTree) render()
})
load()
