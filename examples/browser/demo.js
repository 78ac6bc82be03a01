// The candidate-set demo (python examples/browser/serve.py serves it): loads the bundle
// serve.py exported (bundles/index.json names it), lets createGemm pick the fastest
// candidate on this device (timed on the first visit, then stored), shows what was
// measured and checks the selected kernel's result against a float64 reference.
// ?select=N runs candidate N untimed. For automated checks the outcome is also logged as
// AUTOTUNE_ADAPTER / AUTOTUNE_RESULT lines (base64 JSON), then AUTOTUNE_DONE.
import { checkGemm, requestDeviceFor, scalarsOf } from "./check.js";

const say = (tag, value) => console.log(`${tag} ${btoa(JSON.stringify(value))}`);
const $ = (selector) => document.querySelector(selector);
const describe = (config) =>
  `${config.template} ${Object.entries(config.params).map(([k, v]) => `${k}=${v}`).join(" ")}`;

async function demo() {
  const { bundle } = await (await fetch("./bundles/index.json")).json();
  const { createGemm, manifest } = await import(`./bundles/${bundle}.js`);
  const { M, N, K } = manifest.shape;
  $("#problem").textContent = `${manifest.name}: ${manifest.computes} ` +
    `(${manifest.dtype}, M = ${M}, N = ${N}, K = ${K}), ${manifest.candidates.length} candidates`;
  const adapter = await navigator.gpu?.requestAdapter();
  if (!adapter) throw new Error("this browser offers no WebGPU adapter");
  const { vendor, architecture, device: name, description } = adapter.info ?? {};
  say("AUTOTUNE_ADAPTER", { vendor, architecture, device: name, description });
  $("#adapter").textContent = `Adapter: ${[vendor, architecture, name, description]
    .filter(Boolean).join(" / ")}`;
  const device = await requestDeviceFor(adapter, manifest.candidates);
  const given = new URLSearchParams(location.search).get("select");
  const select = given === null ? "auto" : Number(given);
  const gemm = await createGemm(device, { ...scalarsOf(manifest), select,
                                          adapterInfo: adapter.info });
  showCandidates(manifest, gemm);
  const check = await checkGemm(device, gemm);
  $("#check").textContent = check.ok
    ? `Correct: worst error ${check.worst.toExponential(2)} (tolerance ` +
      `${check.tolerance.toExponential(2)}) against a float64 reference.`
    : `WRONG: worst error ${check.worst} exceeds ${check.tolerance}.`;
  device.destroy();
  say("AUTOTUNE_RESULT", { name: "demo", ...check, selected: gemm.selected,
                           timings: gemm.timings, skipped: gemm.skipped,
                           rows: document.querySelectorAll("#candidates tbody tr").length });
}

function showCandidates(manifest, gemm) {
  const rows = manifest.candidates.map((m, index) => {
    const timing = gemm.timings.find((t) => t.index === index);
    const skipped = gemm.skipped.find((s) => s.index === index);
    const state = skipped ? `skipped: ${skipped.why}`
      : index === gemm.selected.index ? "selected" : timing ? "runs" : "not timed";
    const row = document.createElement("tr");
    if (index === gemm.selected.index) row.className = "selected";
    const cells = [index, describe(m.config), m.provenance.chosen_as,
                   Number.isFinite(timing?.median) ? timing.median.toFixed(3) : "", state];
    for (const text of cells) {
      const cell = row.insertCell();
      cell.textContent = String(text);
    }
    return row;
  });
  $("#candidates tbody").replaceChildren(...rows);
  const how = { timed: "timed just now", stored: "the choice stored on an earlier visit",
                given: "given by ?select" }[gemm.selected.how];
  $("#selected").textContent = `Runs candidate ${gemm.selected.index} ` +
    `(${describe(gemm.selected.config)}): ${how}` +
    (gemm.timings[0] ? `, timed by ${gemm.timings[0].method}.` : ".");
  const again = $("#again");
  again.hidden = gemm.selected.how !== "stored";
  again.onclick = () => {
    for (const key of Object.keys(localStorage)) {
      if (key.startsWith("autotune-gemm:")) localStorage.removeItem(key);
    }
    location.reload();
  };
}

try {
  await demo();
} catch (error) {
  $("#check").textContent = `Failed: ${error}`;
  say("AUTOTUNE_RESULT", { name: "demo", ok: false, errors: [String(error)] });
}
console.log("AUTOTUNE_DONE");
