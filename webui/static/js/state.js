// The page's state lives in the URL's query string, so every view can be shared as a link.

import { body } from './util.js'

export const SELECTION_KEYS = ['from', 'to', 'mode', 'service', 'host', 'instance', 'label']

export function params () { return new URLSearchParams(window.location.search) }

// Applies `change(params)` to the query string; push adds a history entry, else replaces.
export function update (change, { push = true } = {}) {
  const next = params()
  change(next)
  for (const [key, value] of [...next.entries()]) {
    if (value === '') next.delete(key)
  }
  const url = `${window.location.pathname}?${next}`
  if (push) window.history.pushState(null, '', url)
  else window.history.replaceState(null, '', url)
}

// A label filter as the label parameter takes it: key:value, the key as a JSON string where
// it holds ':' or starts with '"' (the twin of label_param in webui/params.py). Values are
// taken exactly: spaces at their ends, tabs, anything a stored value holds.
export function labelParam (key, value) {
  return `${key.includes(':') || key.startsWith('"') ? JSON.stringify(key) : key}:${value}`
}

// A label parameter read back as [key, value] (null if it is none), as webui/params.py reads it.
export function parseLabel (item) {
  const quoted = item.startsWith('"') && item.match(/^"(?:[^"\\]|\\.)*"(?=:)/)
  if (quoted) {
    try { return [JSON.parse(quoted[0]), item.slice(quoted[0].length + 1)] } catch (error) {}
  }
  const at = item.indexOf(':')
  return at < 0 ? null : [item.slice(0, at), item.slice(at + 1)]
}

// The selection parameters the API needs, with the configured default window.
export function selectionParams (source = params()) {
  const out = new URLSearchParams()
  for (const key of SELECTION_KEYS) {
    for (const value of source.getAll(key)) out.append(key, value)
  }
  if (!out.get('from')) out.set('from', body.dataset.defaultWindow || '-1h')
  return out
}

// The flamegraph's own request: the selection and the node budget asked for in the URL
// (webui/pages.py writes the first one into the page's preload link: keep the two alike).
export function graphQuery (source = params()) {
  const query = selectionParams(source)
  if (source.get('max_nodes')) query.set('max_nodes', source.get('max_nodes'))
  return query
}

// The flamegraph request the server named in the page's preload link (see pages.py), which
// the browser started as soon as it read the page's head: asking for the same URL takes its
// response. Null on other pages.
export function preloadedGraphQuery () {
  const link = document.querySelector('link[rel=preload][as=fetch]')
  return link ? new URL(link.href).search.slice(1) : null
}

// No custom headers: a fetch with any is not given a preloaded response (Fetch standard).
export async function api (endpoint, query) {
  const response = await fetch(`${body.dataset.api}/${endpoint}?${query}`)
  let data = null
  try { data = await response.json() } catch (error) { data = null }
  if (!response.ok) {
    throw new Error((data && data.error) || `${endpoint}: HTTP ${response.status}`)
  }
  return data
}
