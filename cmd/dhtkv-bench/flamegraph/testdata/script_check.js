// Runs the zoom and search script of a flame graph written by SVG against a
// minimal stand-in for the browser's DOM, drives it as a reader would, and
// prints the frames' state after each action as JSON for the Go test:
// usage: node script_check.js graph.svg SEARCH-TERM
"use strict";
const fs = require("fs");
const svg = fs.readFileSync(process.argv[2], "utf8");

function el(tag, attrs, text) {
  const e = { tag, attrs: Object.assign({}, attrs), style: {}, children: [], textContent: text || "", listeners: {} };
  for (const [k, v] of (e.attrs.style || "").split(";").map((d) => d.split(":"))) if (v !== undefined) e.style[k.trim()] = v.trim();
  e.getAttribute = (k) => (k in e.attrs ? e.attrs[k] : null);
  e.setAttribute = (k, v) => { e.attrs[k] = String(v); };
  e.querySelector = (t) => e.children.find((c) => c.tag === t) || null;
  e.appendChild = (c) => { e.children.push(c); };
  e.addEventListener = (ev, f) => { e.listeners[ev] = f; };
  e.click = () => e.listeners.click();
  return e;
}
function attrs(s) {
  const out = {};
  for (const m of s.matchAll(/([\w-]+)="([^"]*)"/g)) out[m[1]] = m[2];
  return out;
}
const frames = [];
for (const m of svg.matchAll(/<g class="f"([^>]*)><title>([^<]*)<\/title><rect([^>]*)\/>(?:<text([^>]*)>([^<]*)<\/text>)?<\/g>/g)) {
  const g = el("g", attrs(m[1]));
  g.appendChild(el("title", {}, m[2].replace(/&amp;/g, "&")));
  g.appendChild(el("rect", attrs(m[3])));
  if (m[4] !== undefined) g.appendChild(el("text", attrs(m[4]), m[5]));
  frames.push(g);
}
const byId = {};
for (const m of svg.matchAll(/<text id="(\w+)"([^>]*)>([^<]*)<\/text>/g)) byId[m[1]] = el("text", attrs(m[2]), m[3]);
const script = svg.match(/<!\[CDATA\[([\s\S]*)\]\]>/)[1];

let answer = process.argv[3];
const window = { listeners: {}, addEventListener(ev, f) { this.listeners[ev] = f; } };
const document = {
  querySelectorAll: (sel) => (sel === "g.f" ? frames : []),
  getElementById: (id) => byId[id],
  createElementNS: (_, tag) => el(tag, {}),
};
new Function("document", "window", "prompt", "alert", script)(document, window, () => answer, (e) => { throw new Error(String(e)); });

function state() {
  return {
    frames: frames.map((g) => {
      const r = g.querySelector("rect"), t = g.querySelector("text");
      return {
        name: g.querySelector("title").textContent, shown: g.style.display !== "none", faded: g.style.opacity === "0.6",
        x: +r.attrs.x, width: +r.attrs.width, fill: r.attrs.fill, label: t ? t.textContent : "",
      };
    }),
    reset: byId.reset.style.display !== "none", search: byId.search.textContent, matched: byId.matched.textContent,
  };
}
const find = (prefix) => frames.find((g) => g.querySelector("title").textContent.startsWith(prefix));
const out = { initial: state() };
find(process.argv[4]).click(); out.zoomed = state();
byId.search.click(); out.searched = state();
byId.search.click(); out.cleared = state();
byId.reset.click(); out.reset = state();
console.log(JSON.stringify(out));
