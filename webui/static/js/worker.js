// The worker view: one instance's live profile over the next seconds, from its own sampler.

import { $, body, count, formatTime, showStatus, wireTimeZone } from './util.js'
import { api, params, update } from './state.js'
import { createFlame } from './flame.js'
import { shownName } from './frames.js'

const flame = createFlame($('chart'), {
  label: node => `${shownName(node.data.name)}\n${count(node.data.value)} samples`,
  details: $('details')
})

// The instances the collector polls, the latest sampled first (the default): each named by
// its service, host and address, with the last minute it was sampled.
async function offerInstances () {
  const workers = (await api('workers', new URLSearchParams())).workers
  const wanted = params().get('instance')
  $('instance').replaceChildren(...workers.map(w => {
    const last = w.last === null ? 'no samples stored' : `last sampled ${formatTime(w.last)}`
    const [service, host, target, instance] = [w.service || '?', w.host || '?', w.target, w.instance].map(shownName)
    return new Option(`${service} on ${host}, ${target} (${instance}), ${last}`, w.instance)
  }))
  if (wanted && workers.some(w => w.instance === wanted)) $('instance').value = wanted
  if (!workers.length) showStatus('the collector polls no worker yet')
}

async function record () {
  const instance = $('instance').value
  if (!instance) return
  const seconds = $('seconds').value || '10'
  update(p => { p.set('instance', instance); p.set('seconds', seconds) })
  body.dataset.state = 'loading'
  showStatus('')
  $('summary').textContent = `recording ${shownName(instance)} for ${seconds} s…`
  try {
    const data = await api('live', new URLSearchParams({ instance, seconds }))
    $('summary').textContent = `${count(data.total)} samples from ${shownName(data.target)} over ${data.seconds} s`
    if (data.total) flame.draw(data.tree)
    else flame.clear('The worker took no samples meanwhile (an idle worker uses no CPU).')
    body.dataset.state = 'ready'
  } catch (error) {
    showStatus(error.message)
    $('summary').textContent = ''
    flame.clear(error.message)
    body.dataset.state = 'error'
  }
}

wireTimeZone()
$('record').addEventListener('click', record)
if (params().get('seconds')) $('seconds').value = params().get('seconds')
offerInstances().then(() => { body.dataset.state = 'ready' }).catch(error => showStatus(error.message))
