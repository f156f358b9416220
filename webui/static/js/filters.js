// Window, mode and filter controls; the values offered come from /api/labels.

import { $, el, formatTime, inputTime, showStatus, wireFiltersToggle, wireTimeZone } from './util.js'
import { api, labelParam, params, parseLabel, selectionParams, update } from './state.js'
import { shownName } from './frames.js'

const COLUMNS = ['service', 'host', 'instance']

// The options of a dropdown: the placeholder (no choice), then the values as they are (an
// empty label value too, shown as such; `chosen` tells it from the placeholder), each shown
// as frame names are (a right-to-left override written out, not obeyed).
function fillSelect (select, values, selected, placeholder) {
  const none = new Option(placeholder, '')
  none.dataset.none = '1'
  select.replaceChildren(none)
  const option = value => new Option(value === '' ? '(empty)' : shownName(value), value)
  for (const value of values) select.append(option(value))
  if (selected && !values.includes(selected)) select.append(option(selected))
  select.value = selected || ''
}

// The value chosen in a dropdown filled by fillSelect; null for its placeholder.
function chosen (select) {
  const option = select.selectedOptions[0]
  return !option || option.dataset.none ? null : option.value
}

let changed = () => {}

// Wires the controls; `onChange` runs after the URL changed.
export function setupFilters (onChange) {
  changed = onChange
  for (const button of $('presets').querySelectorAll('button')) {
    button.addEventListener('click', () => {
      update(p => { p.set('from', button.dataset.from); p.delete('to'); p.delete('focus') })
      onChange()
    })
  }
  const apply = () => {
    update(p => { p.set('from', $('from').value.trim()); p.set('to', $('to').value.trim()) })
    onChange()
  }
  $('apply').addEventListener('click', apply)
  for (const id of ['from', 'to']) {
    $(id).addEventListener('keydown', event => { if (event.key === 'Enter') apply() })
  }
  $('mode').addEventListener('change', () => {
    update(p => p.set('mode', $('mode').value)); onChange()
  })
  for (const column of COLUMNS) {
    $(`filter-${column}`).addEventListener('change', event => {
      update(p => { p.delete(column); if (event.target.value) p.set(column, event.target.value) })
      onChange()
    })
  }
  $('label-key').addEventListener('change', () => fillLabelValues())
  $('label-add').addEventListener('click', () => {
    const key = chosen($('label-key'))
    const value = chosen($('label-value'))
    if (key === null || value === null) {
      showStatus(key !== null ? `choose a value of ${shownName(key)} first` : 'choose a label first')
      return
    }
    update(p => p.append('label', labelParam(key, value)))
    onChange()
  })
  window.addEventListener('popstate', onChange)
  wireTimeZone()
  wireFiltersToggle()
}

let labelValues = {}

// The values seen in the window per key (service, host, instance and every label key).
export function currentLabelValues () { return labelValues }

function fillLabelValues () {
  const key = $('label-key').value
  fillSelect($('label-value'), labelValues[key] || [], '', key ? 'value…' : '—')
}

// Shows the URL's state in the controls and refreshes the values offered.
export async function refreshFilters (selection) {
  const p = params()
  // Epoch seconds in a link are shown as ISO 8601 in the chosen zone; relative times as typed.
  // Above 10**11 they are milliseconds, as Grafana's links give them (and the API reads them).
  const epoch = value => Number(value) > 1e11 ? Number(value) / 1000 : Number(value)
  const shown = value => /^\d+$/.test(value || '') ? inputTime(epoch(value)) : (value || '')
  $('from').value = shown(p.get('from'))
  $('to').value = shown(p.get('to'))
  $('mode').value = p.get('mode') || 'cpu'
  for (const button of $('presets').querySelectorAll('button')) {
    button.classList.toggle('active', (p.get('from') || document.body.dataset.defaultWindow) ===
      button.dataset.from && !p.get('to'))
  }
  if (selection) {
    $('window-text').textContent = `${formatTime(selection.from)} → ${formatTime(selection.to)}`
  }
  const chips = $('chips')
  chips.replaceChildren()
  for (const label of p.getAll('label')) {
    const remove = el('button', { type: 'button', title: 'remove', 'aria-label': `remove ${shownName(label)}` }, '×')
    remove.addEventListener('click', () => {
      update(q => {
        const rest = q.getAll('label').filter(l => l !== label)
        q.delete('label'); for (const l of rest) q.append('label', l)
      })
      changed()
    })
    const [key, value] = parseLabel(label) || [label, '']
    chips.append(el('span', { className: 'chip' }, `${shownName(key)} = ${shownName(value)}`, remove))
  }
  try {
    const data = await api('labels', selectionParams())
    labelValues = data.values
  } catch (error) {
    labelValues = {}
  }
  for (const column of COLUMNS) {
    // An empty service, host or instance cannot be asked for (an empty parameter is none).
    const values = (labelValues[column] || []).filter(value => value !== '')
    fillSelect($(`filter-${column}`), values, p.get(column), `all ${column}s`)
  }
  const keys = Object.keys(labelValues).filter(k => !COLUMNS.includes(k)).sort()
  const current = $('label-key').value
  fillSelect($('label-key'), keys, keys.includes(current) ? current : '', 'key…')
  fillLabelValues()
}
