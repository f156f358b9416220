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
// A count and its noun, singular for one: "1 stall", "2 stalls".
export function counted (n, noun) { return `${count(n)} ${noun}${Number(n) === 1 ? '' : 's'}` }

export function showStatus (message) { $('status').textContent = message || '' }

export function regexEscape (text) { return text.replace(/[.*+?^${}()|[\]\\]/g, '\\$&') }

// Reads a regex typed by a person; an invalid one is reported, not thrown.
export function compileSearch (term) {
  if (!term) return null
  try { return new RegExp(term) } catch (error) { return error }
}

// One time zone for every time on every page: UTC unless the user chose their browser's own.
const ZONE_KEY = 'fleetflame.timezone'
export function timeZone () {
  try { return window.localStorage.getItem(ZONE_KEY) === 'local' ? 'local' : 'UTC' } catch (error) { return 'UTC' }
}
export function setTimeZone (zone) {
  try { window.localStorage.setItem(ZONE_KEY, zone === 'local' ? 'local' : 'UTC') } catch (error) {}
}

const two = n => String(n).padStart(2, '0')

// The offset of the chosen zone at a moment, as +01:00 (+00:00 for UTC).
function offset (date) {
  if (timeZone() === 'UTC') return '+00:00'
  const minutes = -date.getTimezoneOffset()
  const sign = minutes < 0 ? '-' : '+'
  return `${sign}${two(Math.floor(Math.abs(minutes) / 60))}:${two(Math.abs(minutes) % 60)}`
}

// The date and time parts of a moment in the chosen zone.
function parts (date) {
  return timeZone() === 'UTC'
    ? [date.getUTCFullYear(), date.getUTCMonth() + 1, date.getUTCDate(), date.getUTCHours(), date.getUTCMinutes(), date.getUTCSeconds()]
    : [date.getFullYear(), date.getMonth() + 1, date.getDate(), date.getHours(), date.getMinutes(), date.getSeconds()]
}

// An epoch second as people read it, in the chosen zone, with the zone: 2026-11-25 01:00:00 UTC.
export function formatTime (epoch) {
  const date = new Date(epoch * 1000)
  const [y, mo, d, h, mi, s] = parts(date)
  const zone = timeZone() === 'UTC' ? 'UTC' : `UTC${offset(date)}`
  return `${y}-${two(mo)}-${two(d)} ${two(h)}:${two(mi)}:${two(s)} ${zone}`
}

// An epoch second as ISO 8601 in the chosen zone with its offset (what the inputs show).
export function inputTime (epoch) {
  const date = new Date(epoch * 1000)
  const [y, mo, d, h, mi, s] = parts(date)
  return `${y}-${two(mo)}-${two(d)}T${two(h)}:${two(mi)}:${two(s)}${offset(date)}`
}

// A d3 time scale in the chosen zone (needs d3 loaded).
export function timeScale () {
  return timeZone() === 'UTC' ? window.d3.scaleUtc() : window.d3.scaleTime()
}

// Tick labels of a time axis in the chosen zone on a 24-hour clock, as formatTime writes times
// (d3's own are 12-hour, with AM/PM on the hour only: 13:12 read as 01:12).
export function timeTicks () {
  const d3 = window.d3
  const utc = timeZone() === 'UTC'
  const format = utc ? d3.utcFormat : d3.timeFormat
  const [second, minute, day, month, year] = utc
    ? [d3.utcSecond, d3.utcMinute, d3.utcDay, d3.utcMonth, d3.utcYear]
    : [d3.timeSecond, d3.timeMinute, d3.timeDay, d3.timeMonth, d3.timeYear]
  const [ms, sec, clock, date, monthName, yearNumber] =
    ['.%L', ':%S', '%H:%M', '%b %d', '%B', '%Y'].map(spec => format(spec))
  return when => (second(when) < when ? ms
    : minute(when) < when ? sec
      : day(when) < when ? clock
        : month(when) < when ? date
          : year(when) < when ? monthName : yearNumber)(when)
}

// An epoch second as ISO 8601 in UTC with its offset written out: 2026-11-25T01:00:00+00:00.
export function isoTime (epoch) {
  return new Date(epoch * 1000).toISOString().replace('.000Z', '+00:00')
}

// The time zone control in the page header: the choice is kept and the page redrawn in it.
export function wireTimeZone () {
  const zone = document.getElementById('timezone')
  if (!zone) return
  zone.value = timeZone()
  zone.addEventListener('change', () => { setTimeZone(zone.value); window.location.reload() })
}

// The button that shows the window and filters on a phone, where they are folded away.
export function wireFiltersToggle () {
  const button = document.getElementById('filters-toggle')
  if (!button) return
  button.addEventListener('click', () => {
    const shown = document.body.classList.toggle('show-filters')
    button.setAttribute('aria-expanded', String(shown))
  })
}
