#include "analysis/PlanExplorer.h"

#include <map>

#include "llvm/Support/JSON.h"
#include "plan/InstructionSet.h"
#include "llvm/Support/raw_ostream.h"

namespace loom {
namespace {

std::string bufferText(const plan::Program &prog, int id) {
  if (id < 0 || id >= prog.buffers_size()) return "?";
  const plan::Buffer &b = prog.buffers(id);
  std::string s;
  for (int64_t d : b.shape()) s += (s.empty() ? "" : "x") + std::to_string(d);
  std::string dtype = plan::DType_Name(b.dtype());
  for (char &c : dtype) c = char(std::tolower(static_cast<unsigned char>(c)));
  return (s.empty() ? "scalar" : s) + " " + dtype;
}

// A program as the page draws it: each instruction with its operands, stream, layer and group,
// the instructions whose results it reads (dataflow) and those it waits for (events).
llvm::json::Object programJson(const plan::Program &prog) {
  llvm::json::Array instructions;
  std::map<int, int> lastWriter;  // buffer -> instruction
  for (int i = 0; i < prog.instructions_size(); ++i) {
    const plan::Instruction &in = prog.instructions(i);
    llvm::json::Array inputs, outputs, reads, waits;
    for (int b : in.inputs()) {
      inputs.push_back(bufferText(prog, b));
      if (auto w = lastWriter.find(b); w != lastWriter.end()) reads.push_back(w->second);
    }
    for (int b : in.outputs()) outputs.push_back(bufferText(prog, b));
    for (int w : in.wait_for()) waits.push_back(w);
    std::string group;
    for (const plan::Attribute &a : in.attributes())
      if (a.name() == "group") group = a.s();
    std::string stream = plan::Stream_Name(in.stream());
    for (char &c : stream) c = char(std::tolower(static_cast<unsigned char>(c)));
    llvm::json::Object node{{"op", in.op()},           {"stream", stream},           {"layer", in.layer()},
                            {"group", group},           {"in", std::move(inputs)},    {"out", std::move(outputs)},
                            {"reads", std::move(reads)}, {"waits", std::move(waits)}};
    // Only in the step's first or last run of the program (ZeRO-1's gathers, gradient syncs).
    // What the collectives view lists: the instructions that communicate (a local op may name a
    // group too: PTD-P's shard).
    if (const isa::OpDecl *d = isa::find(in.op()); d && d->comm != isa::Comm::kNone) node["comm"] = true;
    if (!in.source().empty()) node["src"] = in.source();
    if (in.first_micro_batch()) node["first"] = true;
    if (in.last_micro_batch()) node["last"] = true;
    instructions.push_back(std::move(node));
    for (int b : in.outputs()) lastWriter[b] = i;
  }
  return llvm::json::Object{{"name", prog.name()},
                            {"kind", plan::Program::Kind_Name(prog.kind())},
                            {"stage", prog.virtual_stage()},
                            {"instructions", std::move(instructions)}};
}

llvm::json::Object memoryJsonOf(const plan::RankPlan &rp) {
  const plan::MemoryPlan &m = rp.memory();
  return llvm::json::Object{{"weights", m.parameter_bytes()},
                            {"gradients", m.gradient_bytes()},
                            {"optimizer", m.optimizer_bytes()},
                            {"weight copies", m.half_weight_bytes()},
                            {"stashes", m.peak_stash_bytes()},
                            {"workspace", m.max_workspace_bytes()},
                            {"inputs", m.peak_input_bytes()},
                            {"backend scratch", m.scratch_bytes()},
                            {"communication", m.pipeline_slot_bytes()},
                            {"peak", m.peak_bytes()},
                            {"device", rp.cluster().device().memory_bytes()}};
}

// The page's script and style: no library, no network (the data is the JSON above it).
constexpr const char *kStyle = R"css(
body{font:13px system-ui,sans-serif;margin:0;color:#222}
header{padding:8px 14px;background:#20304a;color:#fff}
header b{font-size:15px}
#check{padding:4px 14px;font-family:monospace;font-size:12px}
nav{display:flex;gap:4px;padding:6px 14px;background:#e8ecf2}
nav button{border:1px solid #9aa7bb;background:#fff;padding:4px 10px;cursor:pointer}
nav button.on{background:#20304a;color:#fff}
section{display:none;padding:10px 14px}
section.on{display:block}
svg{background:#fafbfc;border:1px solid #dde}
#rankinfo,#nodeinfo{margin-top:8px;white-space:pre-wrap;font-family:monospace}
table{border-collapse:collapse}
td,th{border:1px solid #ccd;padding:2px 6px;font-family:monospace;font-size:12px}
.legend span{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px;vertical-align:middle}
)css";

constexpr const char *kScript = R"js(
const D = JSON.parse(document.getElementById('data').textContent);
const L = D.layout, NS = 'http://www.w3.org/2000/svg';
let selected = 0;
function el(tag, attrs, parent) {
  const e = document.createElementNS(NS, tag);
  for (const k in attrs) e.setAttribute(k, attrs[k]);
  if (parent) parent.appendChild(e);
  return e;
}
function human(b) {
  const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB']; let i = 0;
  while (b >= 1024 && i < 4) { b /= 1024; i++; }
  return b.toFixed(i ? 1 : 0) + ' ' + u[i];
}
function stageColour(s) { return 'hsl(' + (s * 137.5 % 360) + ',55%,62%)'; }
function show(name) {
  for (const s of document.querySelectorAll('section')) s.classList.toggle('on', s.id === name);
  for (const b of document.querySelectorAll('nav button')) b.classList.toggle('on', b.dataset.view === name);
}
for (const b of document.querySelectorAll('nav button')) b.onclick = () => show(b.dataset.view);

// The groups of rank r: the ranks that differ from it in one coordinate only (Megatron's tp, cp,
// dp and pp groups; ep: e consecutive dp ranks).
function rankOf(tp, cp, dp, pp) { return ((pp * L.d + dp) * L.c + cp) * L.t + tp; }
function groupsOf(r) {
  const [tp, cp, dp, pp] = D.ranks[r].slice(1, 5), g = {};
  g.tp = [...Array(L.t).keys()].map(i => rankOf(i, cp, dp, pp));
  g.cp = [...Array(L.c).keys()].map(i => rankOf(tp, i, dp, pp));
  g.dp = [...Array(L.d).keys()].map(i => rankOf(tp, cp, i, pp));
  g.pp = [...Array(L.p).keys()].map(i => rankOf(tp, cp, dp, i));
  if (L.e > 1) g.ep = [...Array(L.e).keys()].map(i => rankOf(tp, cp, Math.floor(dp / L.e) * L.e + i, pp));
  return g;
}
const groupColour = {tp: '#d11', cp: '#a0a', dp: '#07c', pp: '#090', ep: '#e80'};

// The rank grid: a block per pipeline stage (blocks in rows of about sqrt(p)), in a block a
// column per (tp, cp) and a row per dp rank; each cell a rank.
function drawGrid() {
  const svg = document.getElementById('gridsvg'), perRow = Math.ceil(Math.sqrt(L.p));
  const bw = L.t * L.c + 1, bh = L.d + 1, cols = perRow * bw, rows = Math.ceil(L.p / perRow) * bh;
  const cell = Math.max(3, Math.min(28, Math.floor(1100 / Math.max(cols, rows))));
  svg.setAttribute('width', cols * cell + 2); svg.setAttribute('height', rows * cell + 2);
  const cells = [];
  for (const rk of D.ranks) {
    const [r, tp, cp, dp, pp] = rk;
    const x = 1 + ((pp % perRow) * bw + cp * L.t + tp) * cell, y = 1 + (Math.floor(pp / perRow) * bh + dp) * cell;
    const c = el('rect', {x: x, y: y, width: cell - 1, height: cell - 1, fill: stageColour(pp), 'data-rank': r}, svg);
    el('title', {}, c).textContent = 'rank ' + r + ': tp ' + tp + ', cp ' + cp + ', dp ' + dp + ', pp ' + pp;
    cells[r] = c;
    c.onmouseenter = () => {
      const g = groupsOf(r);
      for (const k in g) for (const m of g[k]) { cells[m].setAttribute('stroke', groupColour[k]); cells[m].setAttribute('stroke-width', 2); }
      document.getElementById('rankinfo').textContent = 'rank ' + r + ' (tp ' + tp + ', cp ' + cp + ', dp ' + dp +
        ', pp ' + pp + ')\n' + Object.keys(g).map(k => k + ' group: [' + g[k].join(', ') + ']').join('\n');
    };
    c.onmouseleave = () => { for (const m of cells) if (m) m.removeAttribute('stroke'); };
    c.onclick = () => { selected = r; drawPrograms(); drawCollectives(); show('programs'); };
  }
  const legend = document.getElementById('legend');
  for (let s = 0; s < Math.min(L.p, 8); s++) legend.innerHTML += '<span style="background:' + stageColour(s) + '"></span>stage ' + s;
  if (L.p > 8) legend.innerHTML += ' ... (' + L.p + ' stages, a block each)';
  for (const k in groupColour) legend.innerHTML += '<span style="border:2px solid ' + groupColour[k] + '"></span>' + k;
}

// A program as a dataflow graph: a column per stream, instructions in program order.
function drawGraph(prog) {
  const svg = document.getElementById('graph'), W = 190, H = 34, streams = ['compute', 'tp', 'pp', 'dp'];
  svg.innerHTML = '';
  const width = streams.length * (W + 40) + 20, height = prog.instructions.length * (H + 8) + 20;
  svg.setAttribute('width', 1000); svg.setAttribute('height', 640);
  let view = {x: 0, y: 0, w: width, h: Math.min(height, width * 0.64)};
  const setView = () => svg.setAttribute('viewBox', [view.x, view.y, view.w, view.h].join(' '));
  setView();
  const pos = prog.instructions.map((n, i) => ({x: 10 + streams.indexOf(n.stream) * (W + 40), y: 10 + i * (H + 8)}));
  const edges = el('g', {}, svg);
  prog.instructions.forEach((n, i) => {
    for (const [list, colour] of [[n.reads, '#889'], [n.waits, '#e80']])
      for (const j of list) el('path', {d: 'M' + (pos[j].x + W / 2) + ' ' + (pos[j].y + H) + ' L' + (pos[i].x + W / 2) +
        ' ' + pos[i].y, stroke: colour, fill: 'none', 'stroke-width': 1}, edges);
  });
  prog.instructions.forEach((n, i) => {
    const g = el('g', {class: 'node'}, svg);
    el('rect', {x: pos[i].x, y: pos[i].y, width: W, height: H, rx: 4, fill: n.group ? '#fde7c8' : '#dbe6f6', stroke: '#567'}, g);
    el('text', {x: pos[i].x + 6, y: pos[i].y + 14, 'font-size': 12}, g).textContent = i + ' ' + n.op + (n.group ? ' @' + n.group : '');
    el('text', {x: pos[i].x + 6, y: pos[i].y + 28, 'font-size': 10, fill: '#555'}, g).textContent = (n.out[0] || '') + (n.layer >= 0 ? '  layer ' + n.layer : '');
    el('title', {}, g).textContent = n.op + ' on ' + n.stream + (n.group ? ' (group ' + n.group + ')' : '') +
      (n.src ? ', from ' + n.src : ', the step\'s own') +
      '\ninputs: ' + n.in.join(', ') + '\noutputs: ' + n.out.join(', ') + (n.layer >= 0 ? '\nlayer ' + n.layer : '');
    g.onclick = () => document.getElementById('nodeinfo').textContent = g.lastChild.textContent;
  });
  svg.onwheel = e => {
    e.preventDefault();
    const f = e.deltaY > 0 ? 1.2 : 1 / 1.2;
    view.w *= f; view.h *= f; setView();
  };
  let drag = null;
  svg.onmousedown = e => drag = {x: e.clientX, y: e.clientY, vx: view.x, vy: view.y};
  svg.onmousemove = e => {
    if (!drag) return;
    const s = view.w / svg.clientWidth;
    view.x = drag.vx - (e.clientX - drag.x) * s; view.y = drag.vy - (e.clientY - drag.y) * s; setView();
  };
  svg.onmouseup = svg.onmouseleave = () => drag = null;
}
function drawPrograms() {
  const file = D.programFiles[D.ranks[selected][5]], sel = document.getElementById('progsel');
  document.getElementById('progtitle').textContent = 'rank ' + selected + ' runs ' + file.name + ' (' +
    file.programs.length + ' programs)';
  sel.innerHTML = '';
  file.programs.forEach((p, i) => sel.innerHTML += '<option value="' + i + '">' + p.name + ' (' + p.kind.toLowerCase() +
    ', ' + p.instructions.length + ' instructions)</option>');
  sel.onchange = () => drawGraph(file.programs[+sel.value]);
  drawGraph(file.programs[0]);
}

// loomc check's verdict; a collective that differs between ranks ("collective #N of group G:
// ...") is marked on the rows of call N of group G.
const mismatch = D.check.ok ? null : (D.check.text.match(/collective #(\d+) of group (\S+):/) || null);
function drawCheck() {
  const c = document.getElementById('check');
  c.textContent = 'loomc check: ' + (D.check.ok ? D.check.text : 'MISMATCH: ' + D.check.text);
  c.style.color = D.check.ok ? '#063' : '#b00';
}
// The rank's collective calls in schedule order: each program run (runs of one program
// collapsed) with its collectives in order, their group and the group's members.
function drawCollectives() {
  const t = document.getElementById('colltable'), file = D.programFiles[D.ranks[selected][5]], g = groupsOf(selected);
  const byName = {}, firstRow = {}, lastRow = {};
  for (const p of file.programs) byName[p.name] = p;
  file.schedule.forEach(([name], k) => { if (!(name in firstRow)) firstRow[name] = k; lastRow[name] = k; });
  let html = '<tr><th>program (micro-batch, runs)</th><th>#</th><th>call</th><th>group</th><th>members</th></tr>', n = 0;
  const perGroup = {};  // calls of each group so far (the checker counts them from 0)
  file.schedule.forEach(([name, mb, allRuns], row) => {
    const p = byName[name];
    if (!p) return;
    p.instructions.forEach((ins, i) => {
      if (!ins.comm || !ins.group) return;
      // A first- or last-run instruction runs once, in the row holding that run.
      if ((ins.first && row !== firstRow[name]) || (ins.last && row !== lastRow[name])) return;
      const runs = ins.first || ins.last ? 1 : allRuns;
      n += runs;
      const base = ins.group.replace(/^(e?dp|dpcp)$/, m => m === 'edp' ? 'dp' : m === 'dpcp' ? 'dp' : m);
      const members = (g[ins.group] || g[base] || []).join(',');
      const first = perGroup[ins.group] || 0;
      perGroup[ins.group] = first + runs;
      const bad = mismatch && mismatch[2] === ins.group && first <= +mismatch[1] && +mismatch[1] < first + runs;
      html += '<tr class="call' + (bad ? ' mismatch' : '') + '" title="group ' + ins.group + ': ranks [' + members + ']' +
        (bad ? '; loomc check: ' + D.check.text.replace(/"/g, "'") : '') + '"' + (bad ? ' style="background:#f7c6c6"' : '') +
        '><td>' + name + ' (' + mb +
        (runs > 1 ? ', x' + runs : '') + ')</td><td>' + i + '</td><td>' + ins.op +
        ' ' + (ins.in[0] || '') + '</td><td>' + ins.group + '</td><td>' + members + '</td></tr>';
    });
  });
  t.innerHTML = html;
  document.getElementById('colltitle').textContent = 'rank ' + selected + ': ' + n + ' collective calls per step';
}

// The simulator's step: a row per simulated rank, its programs and its communication as bars.
function drawTimeline() {
  const svg = document.getElementById('tl'), T = D.timeline;
  if (!T) { svg.outerHTML = '<p>no timeline (the plans\' cluster spec lacks the device facts the simulator needs)</p>'; return; }
  const W = 1100, row = 26, left = 70, scale = (W - left - 10) / Math.max(T.step, 1e-12);
  svg.setAttribute('width', W); svg.setAttribute('height', T.ranks.length * row * 2 + 30);
  T.ranks.forEach((r, k) => {
    const y = 10 + k * row * 2;
    el('text', {x: 4, y: y + 15, 'font-size': 11}, svg).textContent = 'rank ' + r.rank;
    for (const s of r.spans) {
      const b = el('rect', {x: left + s.start * scale, y: y, width: Math.max(1, (s.end - s.start) * scale), height: row - 4,
        fill: s.kind === 'BACKWARD' ? '#7a9cc6' : s.kind === 'FORWARD' ? '#9fd0a0' : '#d8b36a', class: 'bar'}, svg);
      el('title', {}, b).textContent = s.program + (s.microBatch >= 0 ? ' micro-batch ' + s.microBatch : '') + ': ' +
        (s.start * 1e3).toFixed(3) + '..' + (s.end * 1e3).toFixed(3) + ' ms';
    }
    for (const c of r.communication) {
      const b = el('rect', {x: left + c.start * scale, y: y + row, width: Math.max(1, (c.end - c.start) * scale),
        height: row / 2, fill: '#e07b39', class: 'bar'}, svg);
      el('title', {}, b).textContent = c.kind + ': ' + (c.start * 1e3).toFixed(3) + '..' + (c.end * 1e3).toFixed(3) + ' ms';
    }
  });
  document.getElementById('tltitle').textContent = T.ranks.length + ' of ' + T.simulatedRanks + ' simulated ranks, ' +
    T.programBars + ' program bars and ' + T.communicationBars + ' communication bars (' + T.communicationSpans +
    ' transfers, those of a kind that nearly touch merged); step ' + (T.step * 1e3).toFixed(3) + ' ms, bubble ' +
    (100 * T.bubble).toFixed(1) + '%, exposed communication: ' +
    Object.entries(T.exposed).map(([k, v]) => k + ' ' + (v * 1e3).toFixed(3) + ' ms').join(', ');
}

// Memory per rank by part, against the device's memory.
function drawMemory() {
  const svg = document.getElementById('mem'), parts = ['weights', 'gradients', 'optimizer', 'weight copies', 'stashes',
    'workspace', 'inputs', 'backend scratch', 'communication'];
  const colours = ['#4e79a7', '#f28e2b', '#e15759', '#76b7b2', '#59a14f', '#edc948', '#b07aa1', '#ff9da7', '#9c755f'];
  const shown = D.memoryRanks, row = 22, W = 1000, left = 70;
  const most = Math.max(...shown.map(r => Math.max(D.memory[D.ranks[r][6]].device || 0, D.memory[D.ranks[r][6]].peak)));
  svg.setAttribute('width', W + 200); svg.setAttribute('height', shown.length * row + 20);
  shown.forEach((r, k) => {
    const m = D.memory[D.ranks[r][6]], y = 10 + k * row;
    let x = left;
    el('text', {x: 4, y: y + 14, 'font-size': 11}, svg).textContent = 'rank ' + r;
    parts.forEach((p, i) => {
      const w = (m[p] || 0) / most * W;
      if (w <= 0) return;
      const b = el('rect', {x: x, y: y, width: w, height: row - 4, fill: colours[i]}, svg);
      el('title', {}, b).textContent = p + ': ' + human(m[p]);
      x += w;
    });
    if (m.device) el('line', {x1: left + m.device / most * W, x2: left + m.device / most * W, y1: y - 2, y2: y + row - 2,
      stroke: '#000', 'stroke-width': 2}, svg);
    el('text', {x: x + 6, y: y + 14, 'font-size': 11}, svg).textContent = 'peak ' + human(m.peak) +
      (m.device ? ' of ' + human(m.device) : '');
  });
  document.getElementById('memlegend').innerHTML = parts.map((p, i) => '<span style="background:' + colours[i] + '"></span>' + p).join('');
}

drawCheck(); drawGrid(); drawPrograms(); drawCollectives(); drawTimeline(); drawMemory();
show('grid');
)js";

// JSON fit to sit inside a <script> element: "</" would end it.
std::string scriptSafe(const std::string &json) {
  std::string safe;
  for (size_t i = 0; i < json.size(); ++i) {
    if (json[i] == '<' && i + 1 < json.size() && json[i + 1] == '/') safe += "<\\";
    else safe += json[i];
  }
  return safe;
}

constexpr const char *kSearchScript = R"js(
const C = JSON.parse(document.getElementById('data').textContent), NS = 'http://www.w3.org/2000/svg';
const cols = [['#', (c, i) => i + 1], ['t', c => c.tensor_parallel_size], ['p', c => c.pipeline_parallel_size],
  ['d', c => c.data_parallel_size], ['v', c => c.virtual_pipeline_size], ['b', c => c.micro_batch_size],
  ['cp', c => c.context_parallel_size], ['ep', c => c.expert_parallel_size], ['recompute', c => c.recompute],
  ['sp', c => c.sequence_parallel ? 'yes' : ''], ['zero1', c => c.zero1 ? 'yes' : ''], ['schedule', c => c.schedule],
  ['step ms', c => +(c.step_time_s * 1e3).toFixed(3)], ['TFLOP/s', c => +c.tflops_per_device.toFixed(4)],
  ['MFU %', c => +(100 * c.mfu).toFixed(1)], ['memory MiB', c => +(c.peak_memory_bytes / 2 ** 20).toFixed(1)],
  ['bubble %', c => +(100 * c.bubble).toFixed(1)]];
let rows = C.map((c, i) => cols.map(([, f]) => f(c, i))), sortBy = 0, up = true;
function drawTable() {
  const t = document.getElementById('table');
  let html = '<tr>' + cols.map(([n], k) => '<th data-k="' + k + '">' + n + (k === sortBy ? (up ? ' &#9650;' : ' &#9660;') : '') + '</th>').join('') + '</tr>';
  for (const r of rows) html += '<tr class="candidate">' + r.map(v => '<td>' + v + '</td>').join('') + '</tr>';
  t.innerHTML = html;
  for (const th of t.querySelectorAll('th')) th.onclick = () => {
    const k = +th.dataset.k;
    up = k === sortBy ? !up : true; sortBy = k;
    rows.sort((a, b) => (a[k] < b[k] ? -1 : a[k] > b[k] ? 1 : 0) * (up ? 1 : -1));
    drawTable();
  };
}
function drawScatter() {
  const svg = document.getElementById('scatter'), W = 700, H = 420, m = 50;
  const xs = C.map(c => c.peak_memory_bytes / 2 ** 20), ys = C.map(c => c.tflops_per_device);
  // Axes over the candidates' range (5% margins), not from zero: they differ by a few percent.
  const span = v => { const lo = Math.min(...v), hi = Math.max(...v), pad = (hi - lo) * 0.05 || Math.abs(hi) * 0.05 || 1;
                      return [lo - pad, hi + pad]; };
  const [xmin, xmax] = span(xs), [ymin, ymax] = span(ys);
  const el = (tag, a) => { const e = document.createElementNS(NS, tag); for (const k in a) e.setAttribute(k, a[k]); svg.appendChild(e); return e; };
  svg.setAttribute('width', W); svg.setAttribute('height', H);
  el('line', {x1: m, y1: H - m, x2: W - 10, y2: H - m, stroke: '#444'});
  el('line', {x1: m, y1: 10, x2: m, y2: H - m, stroke: '#444'});
  el('text', {x: W / 2 - 120, y: H - 12, 'font-size': 12}).textContent = 'peak memory per rank, MiB (' +
    xmin.toPrecision(3) + ' .. ' + xmax.toPrecision(3) + ')';
  el('text', {x: m + 6, y: 20, 'font-size': 12}).textContent = 'TFLOP/s per device (' + ymin.toPrecision(3) + ' .. ' +
    ymax.toPrecision(3) + ')';
  C.forEach((c, i) => {
    const p = el('circle', {cx: m + (xs[i] - xmin) / (xmax - xmin) * (W - m - 10),
      cy: H - m - (ys[i] - ymin) / (ymax - ymin) * (H - m - 30), r: i === 0 ? 6 : 4,
      fill: i === 0 ? '#d33' : '#3a6ea5', 'fill-opacity': 0.7, class: 'point'});
    const t = document.createElementNS(NS, 'title');
    t.textContent = '#' + (i + 1) + ' t=' + c.tensor_parallel_size + ' p=' + c.pipeline_parallel_size + ' d=' + c.data_parallel_size +
      ' b=' + c.micro_batch_size + ': ' + c.tflops_per_device.toPrecision(4) + ' TFLOP/s, ' + xs[i].toFixed(1) + ' MiB';
    p.appendChild(t);
  });
}
drawTable(); drawScatter();
)js";

}  // namespace

std::string searchExplorerHtml(const std::string &candidatesJson, const std::string &title) {
  std::string safe = scriptSafe(candidatesJson);
  std::string out;
  llvm::raw_string_ostream os(out);
  os << "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>" << title << "</title><style>" << kStyle
     << "section{display:block}th{cursor:pointer;background:#e8ecf2}</style></head>\n<body>\n<header><b>" << title
     << "</b> &nbsp; the best candidate in red; click a column to sort, hover a point</header>\n"
     << "<section><svg id=\"scatter\"></svg></section>\n<section><table id=\"table\"></table></section>\n"
     << "<script id=\"data\" type=\"application/json\">" << safe << "</script>\n<script>" << kSearchScript
     << "</script>\n</body></html>\n";
  os.flush();
  return out;
}

std::string planExplorerHtml(const PlanDirectory &plans, const StepPrediction *prediction, const CheckVerdict &check) {
  const plan::RankPlan &r0 = plans.ranks.at(0);
  int e = std::max(1, int(r0.cluster().parallel().expert_parallel_size()));
  llvm::json::Object layout{{"t", r0.t()},   {"p", r0.p()}, {"d", r0.d()}, {"c", std::max(1, r0.c())},
                            {"v", r0.v()},   {"e", e},      {"world", r0.world_size()},
                            {"model", r0.model()}, {"schedule", r0.schedule_kind()}};
  // Each programs file and each distinct memory plan once; ranks point at them.
  std::map<std::string, int> fileIndex, memoryIndex;
  llvm::json::Array files, memories, ranks, memoryRanks;
  std::map<int, bool> stageShown;
  for (const plan::RankPlan &rp : plans.ranks) {
    auto [f, newFile] = fileIndex.try_emplace(rp.programs_file(), int(fileIndex.size()));
    if (newFile) {
      llvm::json::Array programs;
      for (const plan::Program &prog : plans.programFiles.at(rp.programs_file()).programs())
        programs.push_back(programJson(prog));
      // The schedule, runs of one program collapsed: (program, first micro-batch, runs).
      llvm::json::Array schedule;
      for (int i = 0; i < rp.schedule_size();) {
        int j = i;
        while (j + 1 < rp.schedule_size() && rp.schedule(j + 1).program() == rp.schedule(i).program()) ++j;
        schedule.push_back(llvm::json::Array{rp.schedule(i).program(), rp.schedule(i).micro_batch(), j - i + 1});
        i = j + 1;
      }
      files.push_back(llvm::json::Object{
          {"name", rp.programs_file()}, {"programs", std::move(programs)}, {"schedule", std::move(schedule)}});
    }
    std::string key = rp.memory().SerializeAsString() + rp.cluster().device().SerializeAsString();
    auto [m, newMemory] = memoryIndex.try_emplace(key, int(memoryIndex.size()));
    if (newMemory) memories.push_back(memoryJsonOf(rp));
    // The memory view shows one rank of each stage (ranks of a stage plan the same memory).
    if (!stageShown[rp.pp_rank()]) stageShown[rp.pp_rank()] = true, memoryRanks.push_back(rp.rank());
    ranks.push_back(llvm::json::Array{rp.rank(), rp.tp_rank(), rp.cp_rank(), rp.dp_rank(), rp.pp_rank(), f->second,
                                      m->second});
  }
  llvm::json::Value timeline = nullptr;
  if (prediction) {
    // At most kTimelineRows simulated ranks (evenly spaced over the stages), and each stream's
    // communication spans of one kind merged where they nearly touch (a gap under 1/2000 of the
    // step): a 3072-rank job's page stays a few MiB.
    constexpr size_t kTimelineRows = 16;
    const std::vector<RankPrediction> &all = prediction->ranks;
    size_t shown = std::min(all.size(), kTimelineRows);
    llvm::json::Array rows;
    int64_t programBars = 0, communicationBars = 0, communicationSpans = 0;
    double gap = prediction->stepSeconds / 2000;
    for (size_t k = 0; k < shown; ++k) {
      const RankPrediction &rank = all[shown == all.size() ? k : k * (all.size() - 1) / (shown - 1)];
      llvm::json::Array spans, communication;
      for (const ProgramSpan &s : rank.spans)
        spans.push_back(llvm::json::Object{{"program", s.program},
                                           {"kind", plan::Program::Kind_Name(s.kind)},
                                           {"microBatch", s.microBatch},
                                           {"start", s.start},
                                           {"end", s.end}});
      std::map<std::string, std::vector<std::pair<double, double>>> byKind;
      for (const CommunicationSpan &c : rank.communication) {
        auto &list = byKind[c.kind];
        if (!list.empty() && c.start - list.back().second < gap)
          list.back().second = std::max(list.back().second, c.end);
        else
          list.push_back({c.start, c.end});
      }
      communicationSpans += int64_t(rank.communication.size());
      for (auto &[kind, list] : byKind)
        for (auto [start, end] : list)
          communication.push_back(llvm::json::Object{{"kind", kind}, {"start", start}, {"end", end}});
      programBars += int64_t(spans.size()), communicationBars += int64_t(communication.size());
      rows.push_back(llvm::json::Object{{"rank", rank.rank}, {"spans", std::move(spans)},
                                        {"communication", std::move(communication)}});
    }
    llvm::json::Object exposed;
    for (const auto &[kind, seconds] : prediction->exposedByKind) exposed[kind] = seconds;
    timeline = llvm::json::Object{{"step", prediction->stepSeconds},
                                  {"bubble", prediction->bubble},
                                  {"exposed", std::move(exposed)},
                                  {"simulatedRanks", int64_t(all.size())},
                                  {"programBars", programBars},
                                  {"communicationBars", communicationBars},
                                  {"communicationSpans", communicationSpans},
                                  {"ranks", std::move(rows)}};
  }
  llvm::json::Object data{{"layout", std::move(layout)},     {"ranks", std::move(ranks)},
                          {"programFiles", std::move(files)}, {"memory", std::move(memories)},
                          {"memoryRanks", std::move(memoryRanks)}, {"timeline", std::move(timeline)},
                          {"check", llvm::json::Object{{"ok", check.checked}, {"text", check.text}}}};
  std::string json;
  llvm::raw_string_ostream js(json);
  js << llvm::json::Value(std::move(data));
  js.flush();
  std::string safe = scriptSafe(json);
  std::string title = "Loom plans: " + r0.model() + ", " + std::to_string(r0.world_size()) + " ranks";
  std::string out;
  llvm::raw_string_ostream os(out);
  os << "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>" << title << "</title><style>" << kStyle
     << "</style></head>\n<body>\n<header><b>" << title << "</b> &nbsp; (t, p, d, c, v, ep) = (" << r0.t() << ", "
     << r0.p() << ", " << r0.d() << ", " << std::max(1, r0.c()) << ", " << r0.v() << ", " << e << "), schedule "
     << r0.schedule_kind() << "</header><div id=\"check\"></div>\n"
     << "<nav><button data-view=\"grid\">Ranks</button><button data-view=\"programs\">Programs</button>"
        "<button data-view=\"collectives\">Collectives</button><button data-view=\"timeline\">Timeline</button>"
        "<button data-view=\"memory\">Memory</button></nav>\n"
     << "<section id=\"grid\"><div class=\"legend\" id=\"legend\"></div><p>a block per pipeline stage, in it a column per (tp, cp) "
        "and a row per dp rank; hover a rank for its groups, click it for its programs</p><svg id=\"gridsvg\"></svg><div id=\"rankinfo\">"
        "</div></section>\n"
     << "<section id=\"programs\"><p id=\"progtitle\"></p><select id=\"progsel\"></select><p>a column per stream "
        "(compute, tp, pp, dp); grey edges: the producer of an input, orange: a wait; wheel zooms, drag pans</p>"
        "<svg id=\"graph\"></svg><div id=\"nodeinfo\"></div></section>\n"
     << "<section id=\"collectives\"><p id=\"colltitle\"></p><table id=\"colltable\"></table></section>\n"
     << "<section id=\"timeline\"><p id=\"tltitle\"></p><svg id=\"tl\"></svg></section>\n"
     << "<section id=\"memory\"><div class=\"legend\" id=\"memlegend\"></div><p>one rank per pipeline stage; the "
        "black line: the device's memory</p><svg id=\"mem\"></svg></section>\n"
     << "<script id=\"data\" type=\"application/json\">" << safe << "</script>\n<script>" << kScript
     << "</script>\n</body></html>\n";
  os.flush();
  return out;
}

}  // namespace loom
