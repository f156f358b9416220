// A function's share over time under the flamegraph: /api/function-series drawn with its
// deploy markers, change points and the windows where findings saw it rise (issue 15, when
// did it start).

/* global d3 */

import { api } from './state.js'
import { el, pct, timeScale, timeTicks } from './util.js'
import { shownName } from './frames.js'

const HEIGHT = 150
const MARGIN = { top: 18, right: 12, bottom: 22, left: 48 }

// Draws the series of `name` for the selection `query` into `box`; stale answers are dropped.
let ticket = 0

// Shows `message` in `box` instead of a series (for a frame that is no function); an answer
// still on its way for an earlier frame is dropped.
export function showNoSeries (box, message) {
  ticket++
  box.replaceChildren(el('p', { className: 'muted' }, message))
}
export async function showSeries (box, name, query) {
  const mine = ++ticket
  box.replaceChildren(el('p', { className: 'muted' }, `loading the share of ${shownName(name)} over time…`))
  let data
  try {
    data = await api('function-series', `${query}&function=${encodeURIComponent(name)}&kind=total`)
  } catch (error) {
    if (mine === ticket) box.replaceChildren(el('p', { className: 'muted' }, error.message))
    return
  }
  if (mine !== ticket) return
  if (!data.points.length) {
    box.replaceChildren(el('p', { className: 'muted' }, 'No samples in this window.'))
    return
  }
  const changes = data.change_points.map(c =>
    `${c.t}: ${pct(c.before)} → ${pct(c.after)} (${c.shift > 0 ? '+' : ''}${(c.shift * 100).toFixed(2)} points, ` +
    `interval ${(c.ci_low * 100).toFixed(2)} to ${(c.ci_high * 100).toFixed(2)}, p ${c.p.toPrecision(2)})`)
  const findings = (data.findings || []).map(f =>
    `${f.kind} share +${f.change.toFixed(2)} points (${f.ci_low.toFixed(2)} to ${f.ci_high.toFixed(2)}, q ` +
    `${f.q.toPrecision(2)}) seen from ${f.b_from}, ${shownName(f.compared)}`)
  box.replaceChildren(
    el('h3', {}, `${shownName(name)}: share of samples (self and below) per ${data.bucket_seconds / 60} min`),
    el('p', { className: 'muted' }, changes.length
      ? `change point${changes.length > 1 ? 's' : ''}: ${changes.join('; ')}`
      : 'no change point found in this window'),
    ...(findings.length ? [el('p', { className: 'muted findings-note' }, `finding${findings.length > 1 ? 's' : ''}: ${findings.join('; ')}`)] : []))
  draw(box, data)
}

function draw (box, data) {
  const width = Math.max(300, box.clientWidth)
  const svg = d3.select(box).append('svg').attr('width', width).attr('height', HEIGHT)
    .attr('class', 'series-chart')
  const times = data.points.map(p => new Date(p.t))
  const x = timeScale().domain(d3.extent(times)).range([MARGIN.left, width - MARGIN.right])
  const y = d3.scaleLinear().domain([0, d3.max(data.points, p => p.share) * 1.1 || 1])
    .range([HEIGHT - MARGIN.bottom, MARGIN.top])
  svg.append('g').attr('transform', `translate(0,${HEIGHT - MARGIN.bottom})`).call(d3.axisBottom(x).ticks(6).tickFormat(timeTicks()))
  svg.append('g').attr('transform', `translate(${MARGIN.left},0)`)
    .call(d3.axisLeft(y).ticks(4).tickFormat(v => `${(v * 100).toFixed(1)}%`))
  svg.append('path').datum(data.points).attr('fill', 'none').attr('stroke', '#3465a4')
    .attr('stroke-width', 1.5).attr('d', d3.line().x(p => x(new Date(p.t))).y(p => y(p.share)))
  for (const deploy of data.deploys) {
    const at = x(new Date(deploy.t))
    const g = svg.append('g').attr('class', 'deploy')
    g.append('line').attr('x1', at).attr('x2', at).attr('y1', MARGIN.top).attr('y2', HEIGHT - MARGIN.bottom)
      .attr('stroke', '#888').attr('stroke-dasharray', '4 3')
    // Its label right of the line, or left of it in the chart's right half (not cut off).
    const right = at > (MARGIN.left + width - MARGIN.right) / 2
    g.append('text').attr('x', right ? at - 3 : at + 3).attr('y', MARGIN.top - 4).attr('font-size', 11)
      .attr('text-anchor', right ? 'end' : 'start').text(shownName(`${deploy.label} ${deploy.after}`))
  }
  // A finding's B window, where the collector's comparison saw the regression: a band.
  const [first, last] = x.range()
  for (const finding of data.findings || []) {
    const from = Math.max(first, x(new Date(finding.b_from)))
    const to = Math.min(last, x(new Date(finding.b_to)))
    const g = svg.append('g').attr('class', 'finding')
    g.append('rect').attr('x', from).attr('width', Math.max(3, to - from))
      .attr('y', MARGIN.top).attr('height', HEIGHT - MARGIN.top - MARGIN.bottom)
      .attr('fill', '#e67e22').attr('fill-opacity', 0.25)
    g.append('title').text(`finding: ${finding.kind} share +${finding.change.toFixed(2)} points, ${shownName(finding.compared)}`)
  }
  for (const change of data.change_points) {
    const at = x(new Date(change.t))
    const g = svg.append('g').attr('class', 'change-point')
    g.append('line').attr('x1', at).attr('x2', at).attr('y1', y(change.before)).attr('y2', y(change.after))
      .attr('stroke', '#cc0000').attr('stroke-width', 3)
    g.append('title').text(`change point: ${(change.shift * 100).toFixed(2)} points`)
  }
}
