// The chart of samples per time step above the flamegraph; dragging selects a new window.

/* global d3 */

import { formatTime, timeScale, timeTicks } from './util.js'
import { shownName } from './frames.js'

const HEIGHT = 90
const MARGIN = { top: 6, right: 8, bottom: 18, left: 48 }

// Draws `points` ([[epoch, samples], ...]); calls onSelect(from, to) with epoch seconds.
export function drawTimeline (svgElement, data, onSelect) {
  const { svg, x, width } = drawChart(svgElement, data)
  svg.append('g').attr('class', 'brush')
    .call(brushOver(x, [MARGIN.top, HEIGHT - MARGIN.bottom], width, onSelect))
}

// The compare page's timeline: one brush per side, A over the upper half of the chart and B
// over the lower, each showing its side's window ({ a: [from, to], b: [from, to] }, epoch
// seconds); dragging one calls onSelect(side, from, to).
export function drawSidesTimeline (svgElement, data, windows, onSelect) {
  const { svg, x, width } = drawChart(svgElement, data)
  const middle = (MARGIN.top + HEIGHT - MARGIN.bottom) / 2
  const bands = { a: [MARGIN.top, middle], b: [middle, HEIGHT - MARGIN.bottom] }
  for (const side of ['a', 'b']) {
    const brush = brushOver(x, bands[side], width, (from, to) => onSelect(side, from, to))
    const g = svg.append('g').attr('class', `brush brush-${side}`).call(brush)
    const [from, to] = windows[side].map(t => x(new Date(t * 1000)))
    g.call(brush.move, [Math.max(from, MARGIN.left), Math.min(to, width - MARGIN.right)])
    svg.append('text').attr('class', `side-name side-${side}`).attr('x', 4)
      .attr('y', (bands[side][0] + bands[side][1]) / 2 + 4).text(side.toUpperCase())
  }
}

// A horizontal brush over the rows [top, bottom] of the chart: a drag by the user (not a
// move made by the code) calls onSelect(from, to).
function brushOver (x, [top, bottom], width, onSelect) {
  return d3.brushX()
    .extent([[MARGIN.left, top], [width - MARGIN.right, bottom]])
    .on('end', event => {
      if (!event.selection || !event.sourceEvent) return
      const [from, to] = event.selection.map(px => Math.round(x.invert(px).getTime() / 1000))
      if (to - from >= 1) onSelect(from, to)
    })
}

// The bars (and split lines) and axes; returns the svg selection, the time scale and width.
function drawChart (svgElement, data) {
  const width = svgElement.clientWidth || 800
  const svg = d3.select(svgElement).attr('viewBox', `0 0 ${width} ${HEIGHT}`)
  svg.selectAll('*').remove()
  const step = data.step
  const x = timeScale()
    .domain([new Date(data.selection.from * 1000), new Date(data.selection.to * 1000)])
    .range([MARGIN.left, width - MARGIN.right])
  const y = d3.scaleLinear()
    .domain([0, d3.max(data.points, p => p[1]) || 1]).nice()
    .range([HEIGHT - MARGIN.bottom, MARGIN.top])
  const barWidth = Math.max(1, x(new Date(step * 1000)) - x(new Date(0)) - 1)
  svg.append('g').selectAll('rect').data(data.points).join('rect')
    .attr('class', 'bar')
    .attr('x', p => x(new Date(p[0] * 1000)))
    .attr('y', p => y(p[1]))
    .attr('width', barWidth)
    .attr('height', p => y(0) - y(p[1]))
    .append('title').text(p => `${formatTime(p[0])}: ${p[1]} samples`)
  if (data.series && data.series.length) drawSplit(svg, data, x, y)
  svg.append('g').attr('class', 'axis')
    .attr('transform', `translate(0,${HEIGHT - MARGIN.bottom})`)
    .call(d3.axisBottom(x).ticks(Math.max(2, Math.floor(width / 110))).tickFormat(timeTicks()))
  svg.append('g').attr('class', 'axis')
    .attr('transform', `translate(${MARGIN.left},0)`)
    .call(d3.axisLeft(y).tickValues(y.ticks(3).filter(Number.isInteger)).tickFormat(d3.format('~s')))
  return { svg, x, width }
}

const COLORS = ['#1f77b4', '#d62728', '#2ca02c', '#9467bd', '#8c564b', '#e377c2', '#17becf',
  '#bcbd22', '#7f7f7f', '#ff7f0e', '#393b79', '#637939']

// One line per value of the split key over the bars (the bars stay: they are the sum), and a
// legend; clicking a value filters the page to it.
function drawSplit (svg, data, x, y) {
  const half = data.step * 500 // ms: the middle of each step
  data.series.forEach((series, i) => {
    svg.append('path').datum(series.points).attr('class', 'split-line')
      .attr('fill', 'none').attr('stroke', COLORS[i % COLORS.length]).attr('stroke-width', 1.5)
      .attr('d', d3.line().x(p => x(new Date(p[0] * 1000 + half))).y(p => y(p[1])))
      .append('title').text(`${shownName(data.split)}=${shownName(series.value)}: ${series.total} samples`)
  })
}

// The legend of a split timeline, as buttons: onPick(value) filters the page to one value.
export function splitLegend (box, data, onPick) {
  box.replaceChildren()
  if (!data.series || !data.series.length) return
  data.series.forEach((series, i) => {
    const button = document.createElement('button')
    button.type = 'button'
    button.className = 'split-value'
    button.style.borderLeft = `12px solid ${COLORS[i % COLORS.length]}`
    button.textContent = `${shownName(series.value)} (${series.total})`
    button.title = `show only ${shownName(data.split)}=${shownName(series.value)}`
    button.addEventListener('click', () => onPick(series.value))
    box.append(button)
  })
}
