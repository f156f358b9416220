// The chart of samples per time step above the flamegraph; dragging selects a new window.

/* global d3 */

const HEIGHT = 90
const MARGIN = { top: 6, right: 8, bottom: 18, left: 48 }

// Draws `points` ([[epoch, samples], ...]); calls onSelect(from, to) with epoch seconds.
export function drawTimeline (svgElement, data, onSelect) {
  const width = svgElement.clientWidth || 800
  const svg = d3.select(svgElement).attr('viewBox', `0 0 ${width} ${HEIGHT}`)
  svg.selectAll('*').remove()
  const step = data.step
  const x = d3.scaleTime()
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
    .append('title').text(p => `${new Date(p[0] * 1000).toISOString()}: ${p[1]} samples`)
  svg.append('g').attr('class', 'axis')
    .attr('transform', `translate(0,${HEIGHT - MARGIN.bottom})`)
    .call(d3.axisBottom(x).ticks(Math.max(2, Math.floor(width / 110))))
  svg.append('g').attr('class', 'axis')
    .attr('transform', `translate(${MARGIN.left},0)`)
    .call(d3.axisLeft(y).ticks(3).tickFormat(d3.format('~s')))
  const brush = d3.brushX()
    .extent([[MARGIN.left, MARGIN.top], [width - MARGIN.right, HEIGHT - MARGIN.bottom]])
    .on('end', event => {
      if (!event.selection || !event.sourceEvent) return
      const [from, to] = event.selection.map(px => Math.round(x.invert(px).getTime() / 1000))
      if (to - from >= 1) onSelect(from, to)
    })
  svg.append('g').attr('class', 'brush').call(brush)
}
