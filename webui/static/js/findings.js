// The findings page: regressions the collector's scheduled comparison found.

import { $, body, counted, el, formatTime, regexEscape, showStatus } from './util.js'
import { api, params, selectionParams } from './state.js'
import { refreshFilters, setupFilters } from './filters.js'
import { sortableTable } from './table.js'
import { shownName, unescapeFrame } from './frames.js'

const points = x => `${x.toFixed(2)}%`
const table = sortableTable($('findings'), [
  { key: 'found_at', format: r => formatTime(Math.floor(r.found_at)), className: () => 'time' },
  { key: 'service', format: r => shownName(r.service) },
  { key: 'name', format: r => shownName(r.name), className: () => 'name' },
  { key: 'kind', format: r => r.kind },
  { key: 'a_share', format: r => points(r.a_share), className: () => 'num' },
  { key: 'b_share', format: r => points(r.b_share), className: () => 'num' },
  { key: 'change', format: r => `+${r.change.toFixed(2)} (${r.ci_low.toFixed(2)} to ${r.ci_high.toFixed(2)})`, className: () => 'num pos' },
  { key: 'q', format: r => r.q.toPrecision(2), className: () => 'num' },
  { key: 'compared', format: r => shownName(r.compared), className: () => 'time' },
  { key: 'b_from', format: seriesLink }
], row => { window.location.href = compareLink(row) })

// The comparison a finding made, on this UI, from its columns rather than its stored link:
// the collector wrote links without percent-encoding until 2026-11-29, so a version such as
// 1.4.2+build.8 (a '+' reads as a space) or a service holding '&' named something else.
function compareLink (row) {
  const query = new URLSearchParams({ service: row.service })
  for (const key of ['a_from', 'a_to', 'b_from', 'b_to']) query.set(key, String(row[key]))
  if (row.a_label) { query.set('a_label', row.a_label); query.set('b_label', row.b_label) }
  return `./compare?${query}`
}

// The function's share over time around the finding, from side A's start to an hour past it.
function seriesLink (row) {
  const query = new URLSearchParams({
    service: row.service,
    from: String(Math.min(row.a_from, row.b_from)),
    to: String(Math.max(row.b_to, Math.floor(row.found_at)) + 3600),
    function: row.name,
    search: `^${regexEscape(row.name)}$`
  })
  return el('a', { href: `./?${query}`, onclick: event => event.stopPropagation() }, 'over time')
}

async function load () {
  body.dataset.state = 'loading'
  showStatus('')
  try {
    const data = await api('findings', selectionParams(params()))
    $('summary').textContent = data.findings.length
      ? `${counted(data.findings.length, 'finding')} (click one for its comparison)`
      : 'No regressions found in this window.'
    // Names are stored escaped as in folded text: shown as the flamegraph shows them.
    table.set(data.findings.map(f => ({ ...f, name: unescapeFrame(f.function) })), 'found_at')
    body.dataset.state = 'ready'
    refreshFilters(data.selection)
  } catch (error) {
    showStatus(error.message)
    table.set([])
    $('summary').textContent = ''
    body.dataset.state = 'error'
  }
}

setupFilters(load)
load()
