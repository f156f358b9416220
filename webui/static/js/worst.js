// The worst-cases page: the window's stalls and its routes' slowest requests.

import { $, body, count, counted, formatTime, pct, showStatus, signedPct } from './util.js'
import { api, params, selectionParams } from './state.js'
import { refreshFilters, setupFilters } from './filters.js'
import { createFlame } from './flame.js'
import { sortableTable } from './table.js'
import { displayFrames, shownName } from './frames.js'
import { drawDurations } from './durations.js'
import { deltaColor, markSelfDeltas } from './diffcolor.js'

// Durations to a tenth of a millisecond, and below a millisecond in microseconds (a fast
// route's 42 us read as 0.0 ms).
const ms = seconds => {
  if (seconds === null || seconds === undefined) return '–'
  const micro = Math.round(seconds * 1e6)
  return seconds > 0 && micro < 1000 ? `${micro} µs` : `${(seconds * 1000).toFixed(1)} ms`
}
const time = () => 'time'
const num = () => 'num'
// A column of seconds shown as a duration.
const duration = key => ({ key, format: r => ms(r[key]), className: num })

const stallTable = sortableTable($('stalls'), [
  { key: 'start', format: r => formatTime(Math.floor(r.start)), className: time },
  duration('duration'),
  { key: 'kind', format: r => r.kind },
  { key: 'host', format: r => shownName(r.host) },
  { key: 'thread', format: r => shownName(r.thread) },
  { key: 'name', format: r => shownName(r.name), className: () => 'name' }
], row => {
  const stacks = row.stacks.wall && Object.keys(row.stacks.wall).length ? row.stacks.wall : row.stacks.cpu
  if (stacks && Object.keys(stacks).length) stallFlame.draw(tree(stacks))
  else if (row.unreadable) stallFlame.clear('This stall\'s stacks could not be read (a damaged row of the store, logged by the server).')
  else stallFlame.clear('No stacks were read during this stall (a GIL hold whose holder the watcher could not name has none, and the python engine keeps no CPU samples to add).')
})

const bucketTable = sortableTable($('stall-buckets'), [
  { key: 'start', format: r => formatTime(r.t), className: time },
  { key: 'count', format: r => count(r.count), className: num },
  duration('p50'),
  duration('p99'),
  duration('p999'),
  duration('max')
], () => {})

const routeTable = sortableTable($('routes'), [
  { key: 'name', format: r => shownName(r.name), className: () => 'name' },
  { key: 'count', format: r => count(r.count), className: num },
  { key: 'errors', format: r => count(r.errors), className: num },
  duration('p50'),
  duration('p90'),
  duration('p99'),
  duration('p999'),
  duration('max'),
  duration('queue_p99'),
  duration('total_p99')
], row => { showSlowest(row.name); showSlowDiff(row.name) })

// Each route's slowest requests in the window (the five slowest of the route, over every
// instance), with the stacks sampled while each ran.
let slowest = []
const slowestTable = sortableTable($('slowest'), [
  { key: 'start', format: r => formatTime(Math.floor(r.start)), className: time },
  duration('duration'),
  duration('queue'),
  { key: 'name', format: r => shownName(r.name), className: () => 'name' },
  { key: 'status', format: r => r.status ? String(r.status) : '–', className: num },
  { key: 'path', format: r => shownName(String(r.path || '')) },
  { key: 'host', format: r => shownName(String(r.host || '')) },
  { key: 'thread', format: r => shownName(String(r.thread || '')) }
], row => {
  if (row.stacks && Object.keys(row.stacks).length) slowestFlame.draw(tree(row.stacks))
  else slowestFlame.clear('No samples fell within this request (one shorter than the sampling interval may have none; the python engine keeps none).')
})

function showSlowest (route) {
  const rows = route === null ? slowest : slowest.filter(r => r.name === route)
  $('slowest-title').textContent = route === null
    ? 'The slowest requests of each route'
    : `The slowest requests of ${shownName(route)}`
  $('slowest-summary').textContent = rows.length
    ? `${counted(rows.length, 'request')}, slowest first; click one for the stacks sampled while it ran`
    : `No slowest requests recorded in this window for ${route === null ? 'these filters' : 'this route'}.`
  slowestTable.set(rows, 'duration')
  slowestFlame.clear('')
}

const label = node => `${shownName(node.data.name)}\n${count(node.data.value)}`
const stallFlame = createFlame($('stall-chart'), { label })
const slowFlame = createFlame($('slow-chart'), { label })
const slowestFlame = createFlame($('slowest-chart'), { label })

// Folded stacks and weights as d3-flame-graph's tree (names unescaped, as the API's are).
function tree (stacks) {
  const root = { name: 'all', value: 0, children: [] }
  for (const [stack, weight] of Object.entries(stacks || {})) {
    let node = root
    root.value += weight
    for (const frame of displayFrames(stack)) {
      let child = node.children.find(c => c.name === frame)
      if (!child) { child = { name: frame, value: 0, children: [] }; node.children.push(child) }
      child.value += weight
      node = child
    }
  }
  return root
}

// A route's slowest 1% (B) against all of its samples (A): red, what slow requests do more of.
let slowLargest = 1e-9
const slowDiff = createFlame($('slow-diff-chart'), {
  label: node => `${shownName(node.data.name)}\nall of the route: ${pct(node.data.a)}\n` +
    `slowest 1%: ${pct(node.data.b)}\nin itself: ${signedPct(node.data.self_delta || 0)}`,
  color: node => deltaColor(node.data.self_delta || 0, slowLargest)
})

async function showSlowDiff (route) {
  $('slow-diff-title').textContent = `${shownName(route)}: its slowest 1% (red: more of their time) against all of its samples`
  $('slow-diff-summary').textContent = 'loading…'
  try {
    const query = selectionParams(params())
    query.set('route', route)
    const data = await api('slow-diff', query)
    if (!data.total_a || !data.total_b) {
      $('slow-diff-summary').textContent = ''
      slowDiff.clear(!data.total_b
        ? 'No stacks of this route\'s slowest 1% in the window (a worker judges a request against its p99 of the route, known after the route\'s first 100 requests; the stacks need the native engine).'
        : 'No samples labelled with this route in the window.')
      return
    }
    slowLargest = markSelfDeltas(data.tree, data.total_a, data.total_b)
    const top = data.functions.filter(f => f.self_delta > 0).slice(0, 3)
      .map(f => `${shownName(f.name)} ${signedPct(f.self_delta)}`)
    $('slow-diff-summary').textContent = `${count(data.total_a)} samples of the route, ` +
      `${count(data.total_b)} samples of its slowest requests` + (top.length ? `; most more in the slowest: ${top.join(', ')}` : '')
    slowDiff.draw(data.tree)
  } catch (error) {
    $('slow-diff-summary').textContent = ''
    slowDiff.clear(error.message)
  }
}

function drawOrSay (flame, graph, empty) {
  if (graph.total) flame.draw(graph.tree)
  else flame.clear(empty)
}

let loading = 0

async function load () {
  const ticket = ++loading
  const query = selectionParams(params())
  showStatus('')
  body.dataset.state = 'loading'
  try {
    const [stalls, requests] = await Promise.all([api('stalls', query), api('requests', query)])
    if (ticket !== loading) return
    $('stall-summary').textContent = stalls.count
      ? `${counted(stalls.count, 'stall')}, ${stalls.seconds.toFixed(2)} s in all; ${stalls.stalls.length === 1 ? 'it is' : `the ${stalls.stalls.length} longest`} below (click one for its stacks)`
      : 'No stalls in this window for these filters.'
    stallTable.set(stalls.stalls.map(s => ({ ...s, name: s.what })), 'duration')
    bucketTable.set(stalls.buckets.map(b => ({ ...b, start: b.t, p999: b['p99.9'] })), 'start')
    drawDurations($('stall-durations'), stalls.buckets, stalls.bucket_seconds,
      [stalls.selection.read_from, stalls.selection.read_to])
    drawOrSay(stallFlame, stalls.flamegraph, stalls.count
      ? 'These stalls hold no sampled stacks, so there is nothing to draw.'
      : 'No stalls, so no stall time.')
    const rows = requests.routes.map(r => ({
      name: r.route,
      count: r.count,
      errors: r.errors,
      p50: r.latency.p50,
      p90: r.latency.p90,
      p99: r.latency.p99,
      p999: r.latency['p99.9'],
      max: r.latency.max,
      queue_p99: r.queue.count ? r.queue.p99 : null,
      total_p99: r.total.count ? r.total.p99 : null
    }))
    $('request-summary').textContent = rows.length
      ? `${count(rows.reduce((n, r) => n + r.count, 0))} requests on ${rows.length} routes (latency from the app's call to its answer; queueing from the proxy's X-Request-Start)`
      : 'No requests recorded: add sampler.middleware to the app (docs/worst-cases.md).'
    routeTable.set(rows, 'p99')
    slowest = requests.routes.flatMap(r => (r.slowest || []).map(q => ({ ...q, name: r.route })))
    showSlowest(null)
    drawOrSay(slowFlame, requests.slow_flamegraph, 'No stacks of slow requests in this window (a worker judges a request against its p99 of the route, known after the route\'s first 100 requests; the stacks need the native engine).')
    body.dataset.state = 'ready'
    refreshFilters(stalls.selection)
  } catch (error) {
    if (ticket !== loading) return
    showStatus(error.message)
    for (const id of ['stall-summary', 'request-summary', 'slowest-summary']) $(id).textContent = ''
    stallTable.set([]); bucketTable.set([]); routeTable.set([]); slowestTable.set([])
    slowestFlame.clear('')
    drawDurations($('stall-durations'), [], 60)
    stallFlame.clear(error.message); slowFlame.clear(error.message)
    body.dataset.state = 'error'
    refreshFilters(null)
  }
}

setupFilters(load)
load()
