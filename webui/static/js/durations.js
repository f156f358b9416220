// Stall durations over time on the worst-cases page: per bucket, p50, p99, p99.9 and max as
// lines on a log scale (a 2 s stall and a 60 ms one both readable), a dot where a line has a
// single point.

/* global d3 */

import { formatTime, timeScale, timeTicks } from './util.js'

const HEIGHT = 140
const MARGIN = { top: 14, right: 12, bottom: 20, left: 56 }
const LINES = [
  { key: 'p50', color: '#74a9cf' },
  { key: 'p99', color: '#2b8cbe' },
  { key: 'p99.9', color: '#045a8d' },
  { key: 'max', color: '#c0392b' }
]

// buckets: [{ t, count, p50, p99, 'p99.9', max }] (seconds); step: the buckets' width;
// readWindow: [from, to] epoch seconds read, the x axis (else the buckets' own span).
export function drawDurations (svgElement, buckets, step, readWindow = null) {
  const svg = d3.select(svgElement)
  svg.selectAll('*').remove()
  if (!buckets.length) return
  const width = svgElement.clientWidth || 800
  svg.attr('viewBox', `0 0 ${width} ${HEIGHT}`)
  const [first, last] = d3.extent(buckets, b => b.t)
  const [from, to] = readWindow || [first, last + step]
  const x = timeScale().domain([new Date(Math.min(from, first) * 1000), new Date(Math.max(to, last + step) * 1000)])
    .range([MARGIN.left, width - MARGIN.right])
  const values = buckets.flatMap(b => LINES.map(line => b[line.key])).filter(v => v > 0)
  const y = d3.scaleLog().domain([d3.min(values) * 0.8, d3.max(values) * 1.25])
    .range([HEIGHT - MARGIN.bottom, MARGIN.top])
  const middle = b => x(new Date((b.t + step / 2) * 1000))
  svg.append('g').attr('class', 'axis').attr('transform', `translate(0,${HEIGHT - MARGIN.bottom})`)
    .call(d3.axisBottom(x).ticks(Math.max(2, Math.floor(width / 110))).tickFormat(timeTicks()))
  svg.append('g').attr('class', 'axis').attr('transform', `translate(${MARGIN.left},0)`)
    .call(d3.axisLeft(y).tickValues(logTicks(y)).tickFormat(v => `${+(v * 1000).toPrecision(2)} ms`))
  LINES.forEach((line, i) => {
    const points = buckets.filter(b => b[line.key] > 0)
    // A line joins adjacent buckets only: a bucket without stalls between two breaks it.
    const gapped = points.flatMap((b, k) => k && b.t - points[k - 1].t > step ? [null, b] : [b])
    const g = svg.append('g').attr('class', `duration-line line-${line.key.replace('.', '')}`)
    g.append('path').datum(gapped).attr('fill', 'none').attr('stroke', line.color)
      .attr('stroke-width', 1.5)
      .attr('d', d3.line().defined(b => b !== null).x(middle).y(b => y(b[line.key])))
    g.selectAll('circle').data(points).join('circle').attr('r', 2.5).attr('fill', line.color)
      .attr('cx', middle).attr('cy', b => y(b[line.key]))
      .append('title').text(b => `${formatTime(b.t)}: ${line.key} ${(b[line.key] * 1000).toFixed(1)} ms of ${b.count} stalls`)
    g.append('text').attr('x', MARGIN.left + 8 + i * 70).attr('y', MARGIN.top - 3)
      .attr('font-size', 11).attr('fill', line.color).text(line.key)
  })
}

// Four ticks at most of a log scale: those d3 would label (powers of ten first), thinned; within
// a decade, where it labels every unit (100, 90, 80 ... ms, overlapping), every few of them.
function logTicks (y) {
  const ticks = y.ticks(4)
  const labelled = y.tickFormat(4)
  const named = ticks.filter(v => labelled(v) !== '')
  const pool = named.length >= 2 ? named : ticks
  const every = Math.ceil(pool.length / 4)
  return pool.filter((_, i) => i % every === 0)
}
