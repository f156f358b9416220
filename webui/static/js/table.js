// A sortable table: click a header to sort by it, click a row to act on it.

import { el } from './util.js'
import { shownName } from './frames.js'

// columns: [{ key, format(row) -> text, className(row) }]; rows: objects.
export function sortableTable (table, columns, onRowClick) {
  let rows = []
  let sortKey = null
  let descending = true
  const headers = [...table.querySelectorAll('th')]

  function render () {
    const sorted = [...rows]
    if (sortKey) {
      sorted.sort((a, b) => {
        const x = a[sortKey]
        const y = b[sortKey]
        const order = typeof x === 'string' ? x.localeCompare(y) : Math.abs(x) - Math.abs(y) || x - y
        return descending ? -order : order
      })
    }
    for (const th of headers) {
      th.classList.toggle('sorted-desc', th.dataset.key === sortKey && descending)
      th.classList.toggle('sorted-asc', th.dataset.key === sortKey && !descending)
    }
    const body = table.querySelector('tbody')
    body.replaceChildren(...sorted.map(row => {
      const tr = el('tr', typeof row.name === 'string' ? { title: shownName(row.name) } : {})
      for (const column of columns) {
        const className = column.className ? column.className(row) : ''
        tr.append(el('td', { className }, column.format(row)))
      }
      tr.addEventListener('click', () => {
        for (const other of body.querySelectorAll('tr.focused')) other.classList.remove('focused')
        tr.classList.add('focused')
        onRowClick(row)
      })
      return tr
    }))
  }

  for (const th of headers) {
    th.addEventListener('click', () => {
      if (sortKey === th.dataset.key) descending = !descending
      else { sortKey = th.dataset.key; descending = th.dataset.key !== 'name' && th.dataset.order !== 'asc' }
      render()
    })
  }
  return {
    set (newRows, defaultKey) {
      rows = newRows
      if (!sortKey && defaultKey) sortKey = defaultKey
      render()
    }
  }
}
