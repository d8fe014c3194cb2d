// The plan explorer page (loom-dump --html) run under Node with a minimal DOM: its script must run
// without an exception and draw what the data says (every rank a cell, a rank's groups on hover,
// the programs of the clicked rank as a graph, its collectives, one timeline bar per span the
// page keeps, a memory row per stage). Not a browser: issue 40's browser tests are still to come.
// node plan_explorer_smoke.js PAGE.html WORLD
const fs = require('fs');
const assert = require('assert');
const html = fs.readFileSync(process.argv[2], 'utf8'), world = +process.argv[3];
const data = html.match(/<script id="data" type="application\/json">([\s\S]*?)<\/script>/)[1];
const script = html.match(/<script>([\s\S]*?)<\/script>/)[1];
assert(!/src=|href=["']?https?:/.test(html), 'the page loads nothing from the network');
function El(tag) {
  this.tag = tag; this.attrs = {}; this.children = []; this.html = ''; this.textContent = '';
  this.classList = {toggle() {}}; this.dataset = {}; this.clientWidth = 1000; this.style = {};
}
// As in a browser, setting innerHTML replaces the children.
Object.defineProperty(El.prototype, 'innerHTML', {
  get() { return this.html; }, set(v) { this.html = v; this.children = []; }});
El.prototype.setAttribute = function (k, v) { this.attrs[k] = v; };
El.prototype.removeAttribute = function (k) { delete this.attrs[k]; };
El.prototype.appendChild = function (c) { this.children.push(c); return c; };
Object.defineProperty(El.prototype, 'lastChild', {get() { return this.children[this.children.length - 1]; }});
const byId = {};
global.document = {
  getElementById(id) { return id === 'data' ? {textContent: data} : byId[id] || (byId[id] = new El('div')); },
  createElementNS(ns, tag) { return new El(tag); },
  querySelectorAll() { return []; },
};
new Function(script)();
const D = JSON.parse(data);
const cells = byId.gridsvg.children.filter(c => c.tag === 'rect');
assert.strictEqual(cells.length, world, 'a cell per rank');
const r = Math.min(5, world - 1);
cells[r].onmouseenter();
assert(/tp group: \[/.test(byId.rankinfo.textContent), 'hovering a rank names its groups');
cells[r].onclick();
const file = D.programFiles[D.ranks[r][5]];
file.programs.forEach((p, i) => {
  byId.progsel.value = i; byId.progsel.onchange();
  assert.strictEqual(byId.graph.children.filter(c => c.attrs.class === 'node').length, p.instructions.length, p.name);
});
assert(/<td>/.test(byId.colltable.innerHTML), 'the clicked rank has collective calls');
const calls = +byId.colltitle.textContent.match(/: (\d+) collective calls/)[1];
const T = D.timeline;
assert(T, 'the cluster has device facts: a timeline');
const bars = byId.tl.children.filter(c => c.attrs.class === 'bar').length;
assert.strictEqual(bars, T.programBars + T.communicationBars, 'a bar per kept span');
assert.strictEqual(byId.mem.children.filter(c => c.tag === 'text').length, 2 * D.memoryRanks.length, 'memory rows');
assert(/^loomc check: checked /.test(byId.check.textContent), 'the checker verdict: ' + byId.check.textContent);
// A page whose checker found two ranks entering different collectives marks that call: the same
// page with the verdict swapped for such a message (call 0 of the tp group).
const bad = JSON.parse(data);
bad.check = {ok: false, text: 'collective #0 of group tp: rank 4 forward_1 instruction 1 enters all_gather, but rank 5 ' +
  'forward_1 instruction 1 enters all_reduce'};
for (const k in byId) delete byId[k];
const badData = JSON.stringify(bad);
global.document.getElementById = id => id === 'data' ? {textContent: badData} : byId[id] || (byId[id] = new El('div'));
new Function(script)();
byId.gridsvg.children.filter(c => c.tag === 'rect')[r].onclick();
assert(/^loomc check: MISMATCH: collective #0 of group tp/.test(byId.check.textContent), 'the mismatch is shown');
const marked = (byId.colltable.innerHTML.match(/class="call mismatch"/g) || []).length;
assert.strictEqual(marked, 1, 'call 0 of group tp is marked, once');
console.log('ok: ' + cells.length + ' ranks, ' + file.programs.length + ' programs of rank ' + r + ', ' + calls +
            ' collective calls, ' + bars + ' timeline bars, ' + D.memoryRanks.length + ' memory rows');
