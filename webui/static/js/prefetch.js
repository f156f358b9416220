// Runs before d3 and the page's own scripts load: starts the flamegraph page's two slowest
// requests at once, so the server works while the browser loads the rest.

import { graphQuery, prefetch, selectionParams } from './state.js'

prefetch('flamegraph', graphQuery())
prefetch('timeline', selectionParams())
