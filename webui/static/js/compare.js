// The compare page: two windows or two label values as a differential flamegraph (or side by
// side), and the functions ranked by how their share of each side's total changed.

import { $, body, count, counted, formatTime, pct, regexEscape, showStatus, signedPct } from './util.js'
import { api, labelParam, params, selectionParams, update } from './state.js'
import { refreshFilters, setupFilters } from './filters.js'
import { createFlame } from './flame.js'
import { sortableTable } from './table.js'
import { drawSidesTimeline } from './timeline.js'
import { deltaColor, markSelfDeltas } from './diffcolor.js'
import { shownName } from './frames.js'
import { intervalText, qText, readSignificance, selfSignificant, significanceSummary, withSignificance } from './significance.js'

const SIDE_KEYS = ['a_from', 'a_to', 'a_label', 'b_from', 'b_to', 'b_label']
const PRESETS = {
  previous: { b_from: '-1h', b_to: 'now', a_from: '-2h', a_to: '-1h' },
  yesterday: { b_from: '-1h', b_to: 'now', a_from: '-25h', a_to: '-24h' },
  week: { b_from: '-1h', b_to: 'now', a_from: '-169h', a_to: '-168h' }
}
let maxDelta = 1e-9
let lastData = null
let stats = null // /api/significance's answer for the comparison on screen, once it came

// Changes that are not significant are drawn as no change, unless the user asks for all.
const greyed = () => Boolean(stats && stats.judged && $('significant-only').checked)

function diffColor (node) {
  const delta = greyed() && !selfSignificant(stats, node.data.name) ? 0 : node.data.self_delta || 0
  return deltaColor(delta, maxDelta)
}

const diffLabel = node => {
  const d = node.data
  return `${shownName(d.name)}\nA: ${pct(d.a)} (${count(d.samples_a)} samples)\n` +
    `B: ${pct(d.b)} (${count(d.samples_b)} samples)\nchange: ${signedPct(d.delta)} of total, ` +
    `${signedPct(d.self_delta || 0)} in itself${judgement(d.name)}`
}

// What the statistics say of the function's own share, for the tooltip.
function judgement (name) {
  if (!stats || !stats.judged) return ''
  const [row] = withSignificance([{ name }], stats)
  if (!row.self_judged) return '\nthe function: too rare to judge'
  const verdict = row.self_significant ? 'significant' : 'not significant'
  return `\nthe function's own share: ${intervalText(row, 'self')} (95%), q ${qText(row, 'self')}: ${verdict}`
}

const focusOptions = {
  details: $('details'),
  onSearch: text => { $('search-result').textContent = text },
  onFocus: node => update(p => p.set('focus', flame.pathOf(node)), { push: false })
}
const flame = createFlame($('chart'), { ...focusOptions, label: diffLabel, color: diffColor })

function sideLabel (side) {
  return node => `${shownName(node.data.name)}\n${count(node.data.value)} samples, ` +
    `${pct(node.data[side])} of ${side.toUpperCase()}'s total`
}
const sides = {
  a: createFlame($('chart-a'), { label: sideLabel('a'), details: $('details') }),
  b: createFlame($('chart-b'), { label: sideLabel('b'), details: $('details') })
}

// One side of the differential tree as an ordinary tree of that side's samples.
function sideTree (node, side) {
  const key = side === 'a' ? 'samples_a' : 'samples_b'
  return {
    name: node.name,
    value: node[key],
    [side]: node[side],
    children: node.children.filter(c => c[key] > 0).map(c => sideTree(c, side))
  }
}

const table = sortableTable($('changes'), [
  { key: 'name', format: r => shownName(r.name), className: () => 'name' },
  { key: 'self_a', format: r => pct(r.self_a), className: () => 'num' },
  { key: 'self_b', format: r => pct(r.self_b), className: () => 'num' },
  { key: 'self_delta', format: r => signedPct(r.self_delta), className: r => changeClass(r, 'self') },
  { key: 'self_low', format: r => intervalText(r, 'self'), className: () => 'num muted' },
  { key: 'self_q', format: r => qText(r, 'self'), className: () => 'num muted' },
  { key: 'total_a', format: r => pct(r.total_a), className: () => 'num' },
  { key: 'total_b', format: r => pct(r.total_b), className: () => 'num' },
  { key: 'total_delta', format: r => signedPct(r.total_delta), className: r => changeClass(r, 'total') },
  { key: 'total_low', format: r => intervalText(r, 'total'), className: () => 'num muted' },
  { key: 'total_q', format: r => qText(r, 'total'), className: () => 'num muted' }
], row => {
  const term = `^${regexEscape(row.name)}$`
  $('search').value = term
  search(term)
  const node = flame.widest(row.name)
  if (node && $('layout').value === 'diff') flame.zoomTo(node)
  update(p => { p.set('search', term); if (node) p.set('focus', flame.pathOf(node)) })
})

function sign (x) { return x > 0 ? 'pos' : x < 0 ? 'neg' : '' }

// A change's cell: coloured by its sign; once judged, bold when significant, faint when not.
function changeClass (row, kind) {
  const judged = stats && stats.judged
  const verdict = !judged ? '' : row[`${kind}_significant`] ? 'significant' : 'insignificant'
  return `num ${sign(row[`${kind}_delta`])} ${verdict}`
}

// The changes' table: the diff's rows with what the statistics say of them (when they came).
function showChanges () {
  const rows = lastData.total_a && lastData.total_b ? lastData.functions : []
  table.set(withSignificance(rows, stats), 'self_delta')
}

// Samples over both sides' windows (and what lies between them), a brush for each side's
// window: dragging one sets that side's window.
async function showTimeline (ticket, p, a, b) {
  const query = selectionParams(p)
  query.set('from', String(Math.min(a.read_from, b.read_from)))
  query.set('to', String(Math.max(a.read_to, b.read_to)))
  let data
  try {
    data = await api('timeline', query)
  } catch (error) {
    return // the graph and its error say what matters
  }
  if (ticket !== loading) return
  const windows = { a: [a.read_from, a.read_to], b: [b.read_from, b.read_to] }
  drawSidesTimeline($('timeline'), data, windows, (side, from, to) => {
    update(q => { q.set(`${side}_from`, String(from)); q.set(`${side}_to`, String(to)); q.delete('focus') })
    load()
  })
}

// The statistics come after the graph (they read each replicate): the graph and table first.
async function judge (ticket, query) {
  $('significance').textContent = significanceSummary(null)
  try {
    const data = await api('significance', query)
    if (ticket !== loading) return
    stats = readSignificance(data)
  } catch (error) {
    if (ticket !== loading) return
    stats = { judged: false, reason: error.message, replicates: { a: 0, b: 0 } }
  }
  $('significance').textContent = significanceSummary(stats)
  showChanges()
  if (greyed()) render()
}

function search (term) {
  flame.search(term)
  sides.a.search(term)
  sides.b.search(term)
}

function render () {
  const p = params()
  const layout = p.get('layout') === 'sides' ? 'sides' : 'diff'
  $('layout').value = layout
  $('chart').hidden = layout !== 'diff'
  $('sides').hidden = layout !== 'sides'
  const icicle = $('icicle').checked
  if (!lastData.total_a || !lastData.total_b) {
    const empty = !lastData.total_a ? 'A' : 'B'
    flame.clear(`No samples in side ${empty} for its window and filters: nothing to compare.`)
    $('chart').hidden = false
    $('sides').hidden = true
    return
  }
  if (layout === 'diff') {
    flame.draw(lastData.tree, { icicle })
    const focus = flame.findPath(p.get('focus'))
    if (focus) flame.zoomTo(focus)
  } else {
    sides.a.draw(sideTree(lastData.tree, 'a'), { icicle })
    sides.b.draw(sideTree(lastData.tree, 'b'), { icicle })
  }
  if (p.get('search')) search(p.get('search'))
}

function compareQuery (p) {
  const query = selectionParams(p)
  for (const key of SIDE_KEYS) {
    for (const value of p.getAll(key)) query.append(key, value)
  }
  return query
}

let loading = 0

async function load () {
  const ticket = ++loading
  const p = params()
  for (const key of SIDE_KEYS) $(key).value = p.get(key) || ''
  $('search').value = p.get('search') || ''
  $('icicle').checked = p.get('icicle') === '1'
  $('significant-only').checked = p.get('all_changes') !== '1'
  showStatus('')
  body.dataset.state = 'loading'
  stats = null
  $('significance').textContent = ''
  try {
    const data = await api('diff', compareQuery(p))
    if (ticket !== loading) return
    lastData = data
    maxDelta = markSelfDeltas(data.tree, data.total_a, data.total_b)
    $('legend-scale').textContent = `full colour: ${signedPct(maxDelta).replace('+', '±')} of a side's samples in the frame itself`
    // The windows read (whole buckets), not the windows typed: two adjacent minutes typed off
    // the bucket edges read other minutes than they seem to.
    const read = side => `read ${formatTime(side.read_from)} → ${formatTime(side.read_to)}`
    // Nothing set for either side: both read the shared window, and nothing can differ.
    const same = SIDE_KEYS.some(key => p.get(key)) ? ''
      : 'Both sides are the same window and filters: pick a preset, or set A and B above. '
    $('summary').textContent = same + `A: ${counted(data.total_a, 'sample')}, ${read(data.a)} · ` +
      `B: ${counted(data.total_b, 'sample')}, ${read(data.b)} · ` +
      `${counted(data.nodes, 'frame')}${data.pruned_nodes ? ` (${data.pruned_nodes} [pruned])` : ''}`
    render()
    // An empty side has nothing to compare: no list of "changes" against nothing.
    showChanges()
    body.dataset.state = 'ready'
    refreshFilters({ from: data.b.from, to: data.b.to })
    if (data.total_a && data.total_b) judge(ticket, compareQuery(p))
    showTimeline(ticket, p, data.a, data.b)
  } catch (error) {
    if (ticket !== loading) return
    showStatus(error.message)
    // Nothing stale stays on screen looking like an answer.
    flame.clear(`${error.message}. Change the windows or labels above, or reload the page.`)
    for (const side of Object.values(sides)) side.clear('')
    table.set([])
    $('summary').textContent = ''
    body.dataset.state = 'error'
    refreshFilters(null)
  }
}

setupFilters(load)
$('compare-apply').addEventListener('click', () => {
  // A label offered (from the data) is taken exactly, spaces at its ends too; one typed is
  // trimmed.
  const offered = new Set([...$('label-options').options].map(option => option.value))
  update(p => {
    for (const key of SIDE_KEYS) p.set(key, offered.has($(key).value) ? $(key).value : $(key).value.trim())
  })
  load()
})
// Versions as people number them: 1.4.10 after 1.4.9.
const byVersion = (x, y) => x.localeCompare(y, undefined, { numeric: true })

// The two latest values of the version label seen in the window: A the previous, B the current.
async function previousVersion () {
  const versions = ((await api('labels', selectionParams(params()))).values.version || []).sort(byVersion)
  if (versions.length < 2) {
    showStatus('fewer than two versions (label version) in this window: widen it (e.g. 24 h)')
    return
  }
  const [previous, current] = versions.slice(-2)
  update(p => {
    for (const key of SIDE_KEYS) p.delete(key)
    p.set('a_label', labelParam('version', previous)); p.set('b_label', labelParam('version', current))
  })
  load()
}

// Label values offered in the two label inputs (key:value), from the window's data.
async function offerLabels () {
  try {
    const values = (await api('labels', selectionParams(params()))).values
    const options = []
    for (const [key, list] of Object.entries(values)) {
      if (['service', 'host', 'instance'].includes(key)) continue
      for (const value of list) options.push(new Option(shownName(labelParam(key, value)), labelParam(key, value)))
    }
    $('label-options').replaceChildren(...options)
  } catch (error) {}
}

$('preset-version').addEventListener('click', () => { previousVersion().catch(error => showStatus(error.message)) })
offerLabels()
for (const button of $('compare-presets').querySelectorAll('button[data-preset]')) {
  button.addEventListener('click', () => {
    update(p => {
      p.delete('from'); p.delete('to')
      for (const key of SIDE_KEYS) p.delete(key) // times only: no side keeps a version's label
      for (const [key, value] of Object.entries(PRESETS[button.dataset.preset])) p.set(key, value)
    })
    load()
  })
}
$('search').addEventListener('input', event => {
  search(event.target.value)
  update(p => p.set('search', event.target.value), { push: false })
})
$('reset-zoom').addEventListener('click', () => {
  flame.resetZoom(); sides.a.resetZoom(); sides.b.resetZoom()
  update(p => p.delete('focus'), { push: false })
})
$('icicle').addEventListener('change', event => {
  update(p => p.set('icicle', event.target.checked ? '1' : ''), { push: false })
  if (lastData) render()
})
$('significant-only').addEventListener('change', event => {
  update(p => p.set('all_changes', event.target.checked ? '' : '1'), { push: false })
  if (lastData) render()
})
$('layout').addEventListener('change', event => {
  update(p => p.set('layout', event.target.value === 'sides' ? 'sides' : ''), { push: false })
  if (lastData) render()
})
load()
