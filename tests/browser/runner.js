// Runs exported autotune bundles (?bundles=name1,name2) through their own createGemm/encode
// on random data and compares C with a float64 reference. Reports on the console, with
// the JSON base64-encoded so that Chromium's quoting of console lines cannot mangle it:
//   AUTOTUNE_ADAPTER <base64 json>
//   AUTOTUNE_RESULT <base64 json>   one line per bundle ("loaded": false when NAME.js
//                                   does not parse as an ES module, with the SyntaxError)
//   AUTOTUNE_DONE                   at the end
// A bundle with quantized weights (manifest.weights) runs on the test's files instead:
// NAME.A.bin (A's bytes in the dtype) and the weight as QuantizedWeight.save wrote it,
// NAME_w.data.bin, NAME_w.scales.bin (NAME_w.zeros.bin); its result carries C's bytes
// (base64) for the test to compare with A @ dequantize().T.
// A candidate set (manifest.kind "candidates") runs its selection, on localStorage, and
// the check of the kernel selected; then the page loads again (?reloaded=1) and runs each
// set once more, reported as NAME@reload: the stored choice is reused, not re-timed.
// ?wallclock=name1,... runs those sets on a device without timestamp queries.
const say = (tag, value) => console.log(`${tag} ${btoa(JSON.stringify(value))}`);
const report = (result) => say("AUTOTUNE_RESULT", result);

import { checkGemm, requestDeviceFor, scalarsOf } from "./check.js";

const params = new URLSearchParams(location.search);
const reloaded = params.has("reloaded");

async function runBundle(name) {
  let bundle;
  try {
    bundle = await import(`./${name}.js`);
  } catch (error) {  // the module does not parse: said as such, not as a kernel's fault
    return { name, ok: false, loaded: false, errors: [`${name}.js does not load: ${error}`] };
  }
  const { createGemm, manifest } = bundle;
  if (manifest.kind === "candidates") return await runCandidates(name, createGemm, manifest);
  const adapter = await navigator.gpu.requestAdapter();  // an adapter gives one device
  for (const feature of manifest.required_features) {
    if (!adapter.features.has(feature)) {
      // the bundle must refuse a device without the feature, naming it
      let refused = null;
      try {
        await createGemm(await adapter.requestDevice());
      } catch (error) {
        refused = String(error);
      }
      return { name, loaded: true,
               skipped: `this adapter (${adapter.info?.architecture}) lacks ${feature}`, refused };
    }
  }
  const languageFeatures = navigator.gpu.wgslLanguageFeatures;
  for (const feature of manifest.required_language_features ?? []) {
    if (!languageFeatures?.has(feature)) {  // the bundle must refuse, naming it
      let refused = null;
      try {
        await createGemm(await adapter.requestDevice());
      } catch (error) {
        refused = String(error);
      }
      return { name, loaded: true, skipped: `this browser lacks the WGSL language ` +
               `feature ${feature}`, refused };
    }
  }
  const device = await adapter.requestDevice({
    requiredLimits: manifest.required_limits,
    requiredFeatures: manifest.required_features,
  });
  const uncaptured = [];
  device.addEventListener("uncapturederror", (event) => uncaptured.push(event.error.message));
  device.pushErrorScope("validation");
  if (manifest.weights) return await runQuantized(name, createGemm, manifest, device, uncaptured);
  const gemm = await createGemm(device, scalarsOf(manifest));
  const checked = await checkGemm(device, gemm);
  const validation = await device.popErrorScope();
  const errors = uncaptured.concat(validation ? [validation.message] : []);
  device.destroy();
  return { name, loaded: true, ...checked, ok: errors.length === 0 && checked.ok, errors,
           config: manifest.config };
}

// The adapter's info as a set named in ?othergpu= sees it on the reload: another GPU of
// the same browser (the same vendor, another architecture).
function infoFor(name, adapter) {
  const info = adapter.info;
  if (!reloaded || !(params.get("othergpu") ?? "").split(",").includes(name)) return info;
  return { vendor: info.vendor, architecture: `${info.architecture} (another)`,
           device: info.device, description: info.description };
}

// A candidate set: createGemm's selection on this device, then the selected kernel
// checked; with what was timed, stored and skipped.
async function runCandidates(name, createGemm, manifest) {
  const adapter = await navigator.gpu.requestAdapter();
  const wallClock = (params.get("wallclock") ?? "").split(",").includes(name);
  const device = await requestDeviceFor(adapter, manifest.candidates, { timestamps: !wallClock });
  const uncaptured = [];
  device.addEventListener("uncapturederror", (event) => uncaptured.push(event.error.message));
  const gemm = await createGemm(device, { ...scalarsOf(manifest), adapterInfo: infoFor(name, adapter) });
  device.pushErrorScope("validation");
  const checked = await checkGemm(device, gemm);
  const validation = await device.popErrorScope();
  const errors = uncaptured.concat(validation ? [validation.message] : []);
  const timestamps = device.features.has("timestamp-query");
  device.destroy();
  return { name: reloaded ? `${name}@reload` : name, candidates: true, loaded: true,
           ...checked, ok: errors.length === 0 && checked.ok, errors, timestamps,
           selected: gemm.selected, timings: gemm.timings, skipped: gemm.skipped };
}

// Fetches a file the test wrote, whole, as bytes.
async function bytesOf(file) {
  const response = await fetch(`./${file}`);
  if (!response.ok) throw new Error(`${file}: HTTP ${response.status}`);
  return new Uint8Array(await response.arrayBuffer());
}

// A quantized bundle on the test's A and weight files, bound by name as its usage says.
async function runQuantized(name, createGemm, manifest, device, uncaptured) {
  const usage = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST;
  const buffer = (data, extra = 0) => {
    const buf = device.createBuffer({ size: Math.ceil(data.byteLength / 4) * 4, usage: usage | extra });
    device.queue.writeBuffer(buf, 0, data, 0, data.byteLength & ~3);  // whole words
    if (data.byteLength % 4) {
      const tail = new Uint8Array(4);
      tail.set(data.subarray(data.byteLength & ~3));
      device.queue.writeBuffer(buf, data.byteLength & ~3, tail);
    }
    return buf;
  };
  const byName = Object.fromEntries(manifest.buffers.map((b) => [b.name, b]));
  const files = { B: "data", scales: "scales", zeros: "zeros" };
  const named = {};
  for (const [binding, suffix] of Object.entries(files)) {
    if (byName[binding]) named[binding] = buffer(await bytesOf(`${name}_w.${suffix}.bin`));
  }
  const bufA = buffer(await bytesOf(`${name}.A.bin`));
  const cBytes = byName.C.size_bytes;
  const bufC = buffer(new Uint8Array(cBytes).fill(0xff), GPUBufferUsage.COPY_SRC);  // NaN
  const gemm = await createGemm(device);
  // a quantized kernel's encode refuses to run without its scales (and zeros), by name
  let missing = null;
  try {
    gemm.encode(device.createCommandEncoder(), bufA, named.B, bufC, undefined, {});
  } catch (error) {
    missing = String(error);
  }
  const readback = device.createBuffer({
    size: cBytes, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
  });
  const encoder = device.createCommandEncoder();
  const { B, ...rest } = named;
  gemm.encode(encoder, bufA, B, bufC, undefined, rest);
  encoder.copyBufferToBuffer(bufC, 0, readback, 0, cBytes);
  device.queue.submit([encoder.finish()]);
  await readback.mapAsync(GPUMapMode.READ);
  const raw = new Uint8Array(readback.getMappedRange().slice(0));
  const validation = await device.popErrorScope();
  const errors = uncaptured.concat(validation ? [validation.message] : []);
  device.destroy();
  let binary = "";
  for (const byte of raw) binary += String.fromCharCode(byte);
  return { name, loaded: true, ok: errors.length === 0, errors, missing, C: btoa(binary),
           config: manifest.config };
}

const names = params.get("bundles").split(",");
const sets = [];
const adapter = await navigator.gpu?.requestAdapter();
if (!adapter) {
  report({ name: "*", ok: false, errors: ["no WebGPU adapter"] });
} else {
  const { vendor, architecture, device, description } = adapter.info || {};
  say("AUTOTUNE_ADAPTER", { vendor, architecture, device, description });
  for (const name of names) {
    try {
      const result = await runBundle(name);
      if (result.candidates) sets.push(name);
      report(result);
    } catch (error) {  // thrown after the module loaded (runBundle reports load errors)
      report({ name, loaded: true, ok: false, errors: [String(error)] });
    }
  }
}
if (sets.length && !reloaded) {
  location.search = `?bundles=${sets.join(",")}&wallclock=${params.get("wallclock") ?? ""}` +
                    `&othergpu=${params.get("othergpu") ?? ""}&reloaded=1`;
} else {
  console.log("AUTOTUNE_DONE");
}
