// Small helpers shared by the pages. Every piece of text from the server goes into the page
// through textContent or new Option(): frame names and labels are never parsed as markup.

export const body = document.body

export function el (tag, attributes = {}, ...children) {
  const node = document.createElement(tag)
  for (const [key, value] of Object.entries(attributes)) {
    if (key === 'className') node.className = value
    else if (key.startsWith('on')) node.addEventListener(key.slice(2), value)
    else node.setAttribute(key, value)
  }
  for (const child of children) node.append(child) // strings become text nodes
  return node
}

export function $ (id) { return document.getElementById(id) }

export function pct (share, digits = 2) {
  if (!Number.isFinite(share)) return '–'
  const value = share * 100
  return (Math.abs(value) < 0.01 && value !== 0 ? value.toExponential(1) : value.toFixed(digits)) + '%'
}

export function signedPct (share) {
  return (share > 0 ? '+' : '') + pct(share)
}

export function count (n) { return Number(n).toLocaleString('en-US') }

export function showStatus (message) { $('status').textContent = message || '' }

// The wire format's escaping of a frame name, so a focus path in the URL is unambiguous.
export function escapeFrame (name) {
  return name.replace(/[%;\x00-\x1f\x7f]/g,
    c => '%' + c.charCodeAt(0).toString(16).toUpperCase().padStart(2, '0'))
}

export function unescapeFrame (name) {
  return name.replace(/%([0-9A-F]{2})/g, (_, hex) => String.fromCharCode(parseInt(hex, 16)))
}

export function regexEscape (text) { return text.replace(/[.*+?^${}()|[\]\\]/g, '\\$&') }

// Reads a regex typed by a person; an invalid one is reported, not thrown.
export function compileSearch (term) {
  if (!term) return null
  try { return new RegExp(term) } catch (error) { return error }
}

export function formatTime (epoch) {
  return new Date(epoch * 1000).toISOString().replace('.000Z', 'Z').replace('T', ' ')
}
