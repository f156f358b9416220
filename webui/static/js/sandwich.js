// The sandwich of one function: its callers above it, its callees below, each merged across
// the whole graph (/api/sandwich), as speedscope and Pyroscope show it.

import { api } from './state.js'
import { count, el, pct } from './util.js'
import { createFlame } from './flame.js'
import { shownName } from './frames.js'

let ticket = 0

// Empties `box` (a frame that is no function has no sandwich); an answer still on its way
// for an earlier frame is dropped.
export function clearSandwich (box) {
  ticket++
  box.replaceChildren()
}

export async function showSandwich (box, name, query) {
  const mine = ++ticket
  let data
  try {
    data = await api('sandwich', `${query}&function=${encodeURIComponent(name)}`)
  } catch (error) {
    if (mine === ticket) box.replaceChildren(el('p', { className: 'muted' }, error.message))
    return
  }
  if (mine !== ticket) return
  const callers = el('div', { id: 'sandwich-callers', className: 'chart' })
  const callees = el('div', { id: 'sandwich-callees', className: 'chart' })
  box.replaceChildren(
    el('h3', {}, `Sandwich of ${shownName(name)}: ${count(data.samples)} samples ` +
      `(${pct(data.share)} of all), ${count(data.self)} in itself`),
    el('p', { className: 'muted' }, 'its callers (the function at the bottom, who called it above), merged over every place it runs'),
    callers,
    el('p', { className: 'muted' }, 'its callees (the function at the top, what it called below)'),
    callees)
  const label = node => `${shownName(node.data.name)}\n${count(node.data.value)} samples`
  if (data.callers) createFlame(callers, { label }).draw(data.callers, { icicle: false })
  if (data.callees) createFlame(callees, { label }).draw(data.callees, { icicle: true })
}
