// The compare page: two windows or two label values as a differential flamegraph (or side by
// side), and the functions ranked by how their share of each side's total changed.

import { $, count, pct, regexEscape, showStatus, signedPct, body } from './util.js'
import { api, params, selectionParams, update } from './state.js'
import { refreshFilters, setupFilters } from './filters.js'
import { createFlame } from './flame.js'
import { sortableTable } from './table.js'

const SIDE_KEYS = ['a_from', 'a_to', 'a_label', 'b_from', 'b_to', 'b_label']
const PRESETS = {
  previous: { b_from: '-1h', b_to: 'now', a_from: '-2h', a_to: '-1h' },
  yesterday: { b_from: '-1h', b_to: 'now', a_from: '-25h', a_to: '-24h' },
  week: { b_from: '-1h', b_to: 'now', a_from: '-169h', a_to: '-168h' }
}
const NEUTRAL = [221, 221, 221]
const MORE = [224, 60, 40] // red: more time in B
const LESS = [40, 110, 224] // blue: less time in B

let maxDelta = 1e-9
let lastData = null

function diffColor (node) {
  const delta = node.data.delta || 0
  const strength = Math.sqrt(Math.min(1, Math.abs(delta) / maxDelta))
  const target = delta > 0 ? MORE : LESS
  const rgb = NEUTRAL.map((c, i) => Math.round(c + (target[i] - c) * strength))
  return `rgb(${rgb.join(',')})`
}

const diffLabel = node => {
  const d = node.data
  return `${d.name}\nA: ${pct(d.a)} (${count(d.samples_a)} samples)\n` +
    `B: ${pct(d.b)} (${count(d.samples_b)} samples)\nchange: ${signedPct(d.delta)} of total`
}

const focusOptions = {
  details: $('details'),
  onSearch: text => { $('search-result').textContent = text },
  onFocus: node => update(p => p.set('focus', flame.pathOf(node)), { push: false })
}
const flame = createFlame($('chart'), { ...focusOptions, label: diffLabel, color: diffColor })

function sideLabel (side) {
  return node => `${node.data.name}\n${count(node.data.value)} samples, ` +
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
  { key: 'name', format: r => r.name, className: () => 'name' },
  { key: 'self_a', format: r => pct(r.self_a), className: () => 'num' },
  { key: 'self_b', format: r => pct(r.self_b), className: () => 'num' },
  { key: 'self_delta', format: r => signedPct(r.self_delta), className: r => `num ${sign(r.self_delta)}` },
  { key: 'total_a', format: r => pct(r.total_a), className: () => 'num' },
  { key: 'total_b', format: r => pct(r.total_b), className: () => 'num' },
  { key: 'total_delta', format: r => signedPct(r.total_delta), className: r => `num ${sign(r.total_delta)}` }
], row => {
  const term = `^${regexEscape(row.name)}$`
  $('search').value = term
  search(term)
  const node = flame.widest(row.name)
  if (node && $('layout').value === 'diff') flame.zoomTo(node)
  update(p => { p.set('search', term); if (node) p.set('focus', flame.pathOf(node)) })
})

function sign (x) { return x > 0 ? 'pos' : x < 0 ? 'neg' : '' }

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
  showStatus('')
  body.dataset.state = 'loading'
  try {
    const data = await api('diff', compareQuery(p))
    if (ticket !== loading) return
    lastData = data
    maxDelta = 1e-9
    const visit = node => {
      if (node !== data.tree) maxDelta = Math.max(maxDelta, Math.abs(node.delta))
      node.children.forEach(visit)
    }
    visit(data.tree)
    $('summary').textContent = `A: ${count(data.total_a)} samples · B: ${count(data.total_b)} samples · ` +
      `${data.nodes} frames${data.pruned_nodes ? ` (${data.pruned_nodes} [pruned])` : ''}`
    render()
    table.set(data.functions, 'self_delta')
    body.dataset.state = 'ready'
    refreshFilters({ from: data.b.from, to: data.b.to })
  } catch (error) {
    if (ticket !== loading) return
    showStatus(error.message)
    body.dataset.state = 'error'
    refreshFilters(null)
  }
}

setupFilters(load)
$('compare-apply').addEventListener('click', () => {
  update(p => { for (const key of SIDE_KEYS) p.set(key, $(key).value.trim()) })
  load()
})
for (const button of $('compare-presets').querySelectorAll('button')) {
  button.addEventListener('click', () => {
    update(p => {
      p.delete('from'); p.delete('to')
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
$('layout').addEventListener('change', event => {
  update(p => p.set('layout', event.target.value === 'sides' ? 'sides' : ''), { push: false })
  if (lastData) render()
})
load()
