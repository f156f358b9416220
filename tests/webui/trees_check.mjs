// Runs a function of webui/static/js/trees.js (withoutWaiting unless named) on a tree given as JSON and prints the result, for
// tests/webui/test_web_trees.py. The module is loaded from its text as a data: URL.
import { readFileSync } from 'node:fs'

const [modulePath, treeJson, name = 'withoutWaiting'] = process.argv.slice(2)
const source = readFileSync(modulePath, 'utf8')
const trees = await import('data:text/javascript;base64,' + Buffer.from(source).toString('base64'))
console.log(JSON.stringify(trees[name](JSON.parse(treeJson))))
