// Whether each change the compare page shows is real: /api/significance's findings (per
// function, the change of its self and total share with a 95% interval and a q-value, over
// (instance, bucket) replicates), joined to the table's rows and read by the graph's colours.
// No DOM here.

import { count, pct } from './util.js'

// The answer as the page uses it: findings by kind, then by function name.
export function readSignificance (data) {
  const byKind = { self: new Map(), total: new Map() }
  for (const finding of data.findings || []) byKind[finding.kind].set(finding.function, finding)
  return { ...data, ...byKind }
}

// Whether a function's own (self) share changed for sure; false while nothing is judged.
export function selfSignificant (stats, name) {
  const finding = stats && stats.judged ? stats.self.get(name) : null
  return Boolean(finding && finding.significant)
}

// The table's rows with each kind's interval, q and significance (shares as fractions, the
// table's unit; q Infinity where the function was too rare to judge, so it sorts last).
export function withSignificance (rows, stats) {
  return rows.map(row => {
    const out = { ...row }
    for (const kind of ['self', 'total']) {
      const finding = stats && stats.judged ? stats[kind].get(row.name) : null
      out[`${kind}_low`] = finding ? finding.ci_low / 100 : null
      out[`${kind}_high`] = finding ? finding.ci_high / 100 : null
      out[`${kind}_q`] = finding ? finding.q : Infinity
      out[`${kind}_judged`] = Boolean(finding)
      out[`${kind}_significant`] = Boolean(finding && finding.significant)
    }
    return out
  })
}

const signed = share => (share > 0 ? '+' : '') + pct(share)

export function intervalText (row, kind) {
  if (!row[`${kind}_judged`]) return '–'
  return `${signed(row[`${kind}_low`])} … ${signed(row[`${kind}_high`])}`
}

export function qText (row, kind) {
  if (!row[`${kind}_judged`]) return 'too rare'
  const q = row[`${kind}_q`]
  return q < 0.001 ? q.toExponential(0) : q.toFixed(3)
}

// One line under the graph: what was judged, what is significant, and the noise floor.
export function significanceSummary (stats) {
  if (!stats) return 'judging the changes…'
  const replicates = `${count(stats.replicates.a)} A and ${count(stats.replicates.b)} B replicates (instance × time step)`
  if (!stats.judged) return `Changes not judged: ${stats.reason} (${replicates}).`
  const significant = (stats.findings || []).filter(f => f.significant)
  const floor = stats.noise_floor
  const points = x => (x === null || x === undefined ? '–' : `${x.toFixed(2)} points`)
  return `${significant.length} significant change${significant.length === 1 ? '' : 's'} ` +
    `among ${count(stats.hypotheses)} judged (self and total shares, false discovery rate ` +
    `${pct(stats.fdr, 0)}), over ${replicates}. Noise floor: changes up to ` +
    `${points(floor.largest_change)} appear between halves of the same data; the smallest ` +
    `change this comparison detects (${pct(floor.power, 0)} power) is about ${points(floor.mde)}.`
}
