// The worker view: one instance's live profile over the next seconds, from its own sampler.

import { $, body, count, showStatus, wireTimeZone } from './util.js'
import { api, params, update } from './state.js'
import { createFlame } from './flame.js'
import { shownName } from './frames.js'

const flame = createFlame($('chart'), {
  label: node => `${shownName(node.data.name)}\n${count(node.data.value)} samples`,
  details: $('details')
})

async function offerInstances () {
  const query = new URLSearchParams({ from: '-1h' })
  const instances = (await api('labels', query)).values.instance || []
  const wanted = params().get('instance')
  $('instance').replaceChildren(...instances.map(i => new Option(i, i)))
  if (wanted && instances.includes(wanted)) $('instance').value = wanted
  if (!instances.length) showStatus('no instance polled in the last hour')
}

async function record () {
  const instance = $('instance').value
  if (!instance) return
  const seconds = $('seconds').value || '10'
  update(p => { p.set('instance', instance); p.set('seconds', seconds) })
  body.dataset.state = 'loading'
  showStatus('')
  $('summary').textContent = `recording ${instance} for ${seconds} s…`
  try {
    const data = await api('live', new URLSearchParams({ instance, seconds }))
    $('summary').textContent = `${count(data.total)} samples from ${data.target} over ${data.seconds} s`
    if (data.total) flame.draw(data.tree)
    else flame.clear('The worker took no samples meanwhile (an idle worker uses no CPU).')
    body.dataset.state = 'ready'
  } catch (error) {
    showStatus(error.message)
    $('summary').textContent = ''
    flame.clear(`${error.message}. Pick another instance, or try again.`)
    body.dataset.state = 'error'
  }
}

wireTimeZone()
$('record').addEventListener('click', record)
if (params().get('seconds')) $('seconds').value = params().get('seconds')
offerInstances().then(() => { body.dataset.state = 'ready' }).catch(error => showStatus(error.message))
