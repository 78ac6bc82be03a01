// Runs exported autotune bundles (?bundles=name1,name2) through their own createGemm/encode
// on random data and compares C with a float64 reference. Reports on the console, with
// the JSON base64-encoded so that Chromium's quoting of console lines cannot mangle it:
//   AUTOTUNE_ADAPTER <base64 json>
//   AUTOTUNE_RESULT <base64 json>   one line per bundle ("loaded": false when NAME.js
//                                   does not parse as an ES module, with the SyntaxError)
//   AUTOTUNE_DONE                   at the end
const say = (tag, value) => console.log(`${tag} ${btoa(JSON.stringify(value))}`);
const report = (result) => say("AUTOTUNE_RESULT", result);

function randomMatrix(count, seed) {
  // xorshift32: deterministic values in [-1, 1)
  let state = seed >>> 0 || 1;
  const values = new Float32Array(count);
  for (let i = 0; i < count; i++) {
    state ^= state << 13; state >>>= 0;
    state ^= state >>> 17;
    state ^= state << 5; state >>>= 0;
    values[i] = state / 2147483648 - 1;
  }
  return values;
}

// float32 <-> IEEE half bits (the test data are multiples of 1/256 in [-1, 1]: exact).
const f32 = new Float32Array(1), u32 = new Uint32Array(f32.buffer);
function toHalf(value) {
  f32[0] = value;
  const x = u32[0], sign = (x >>> 16) & 0x8000, exp = (x >>> 23) & 0xff, man = x & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (man ? 0x200 : 0);
  const e = exp - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00;
  if (e <= 0) {
    if (e < -10) return sign;
    const m = (man | 0x800000) >> (1 - e);
    return sign | ((m + 0x1000) >> 13);
  }
  return sign | (e << 10) | ((man + 0x1000) >> 13);
}
function fromHalf(h) {
  const sign = h & 0x8000 ? -1 : 1, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  if (exp === 0) return sign * man * 2 ** -24;
  if (exp === 0x1f) return man ? NaN : sign * Infinity;
  return sign * (1 + man / 1024) * 2 ** (exp - 15);
}

// Values in memory (Float32Array) and their bytes in the kernel's dtype.
function upload(values, dtype) {
  if (dtype === "f32") return values;
  const half = new Uint16Array(values.length + (values.length % 2));  // whole 4-byte words
  for (let i = 0; i < values.length; i++) half[i] = toHalf(values[i]);
  return half;
}
const quantize = (values) => values.map((v) => Math.round(v * 256) / 256);

// The manifest's problem in float64: op(A) op(B) per batch item, then the epilogue.
// Returns the largest (|C - R| - out |R|) / scale, scale = |alpha| sqrt(sum of squared
// products) + |beta C0| + |bias| (through the activation's slope); NaN is infinite.
function worstError(C, ops, m, alpha, beta, out) {
  const { M, N, K } = m.shape;
  const [ta, tb] = [m.layout[0] === "t", m.layout[1] === "t"];
  const gelu = (x) => 0.5 * x * (1 + Math.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3)));
  let worst = 0;
  for (let b = 0; b < m.batch; b++) {
    const a0 = b * M * K, b0 = m.shared_b ? 0 : b * K * N, c0 = b * M * N;
    for (let i = 0; i < M; i++) {
      for (let j = 0; j < N; j++) {
        let sum = 0, squares = 0;
        for (let k = 0; k < K; k++) {
          const a = ops.A[a0 + (ta ? k * M + i : i * K + k)];
          const product = a * ops.B[b0 + (tb ? j * K + k : k * N + j)];
          sum += product;
          squares += product * product;
        }
        let want = alpha * sum, scale = Math.abs(alpha) * Math.sqrt(squares);
        if (ops.C0) { want += beta * ops.C0[c0 + i * N + j]; scale += Math.abs(beta * ops.C0[c0 + i * N + j]); }
        if (ops.bias) { want += ops.bias[j]; scale += Math.abs(ops.bias[j]); }
        if (m.epilogue.activation === "relu") want = Math.max(want, 0);
        if (m.epilogue.activation === "gelu") { want = gelu(want); scale *= 1.13; }
        const excess = Math.max(Math.abs(C[c0 + i * N + j] - want) - out * Math.abs(want), 0);
        const error = excess / Math.max(scale, 1e-300);
        if (!(error <= worst)) worst = Number.isNaN(error) ? Infinity : error;
      }
    }
  }
  return worst;
}

async function runBundle(name) {
  let bundle;
  try {
    bundle = await import(`./${name}.js`);
  } catch (error) {  // the module does not parse: said as such, not as a kernel's fault
    return { name, ok: false, loaded: false, errors: [`${name}.js does not load: ${error}`] };
  }
  const { createGemm, manifest } = bundle;
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
  const device = await adapter.requestDevice({
    requiredLimits: manifest.required_limits,
    requiredFeatures: manifest.required_features,
  });
  const uncaptured = [];
  device.addEventListener("uncapturederror", (event) => uncaptured.push(event.error.message));
  device.pushErrorScope("validation");
  const { M, N, K } = manifest.shape;
  const dtype = manifest.dtype, size = dtype === "f16" ? 2 : 4;
  const count = (binding) => binding.shape.reduce((x, y) => x * y, 1);
  const byName = Object.fromEntries(manifest.buffers.map((b) => [b.name, b]));
  const ops = {
    A: quantize(randomMatrix(count(byName.A), 7 + M)),
    B: quantize(randomMatrix(count(byName.B), 11 + N)),
  };
  const epilogue = manifest.epilogue.ops;
  const alpha = epilogue.includes("alpha") ? 0.75 : 1, beta = epilogue.includes("beta") ? -0.5 : 0;
  if (epilogue.includes("beta")) ops.C0 = quantize(randomMatrix(count(byName.C), 13));
  if (byName.bias) ops.bias = quantize(randomMatrix(N, 17));
  const usage = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST;
  const buffer = (values, extra = 0) => {
    const data = upload(values, dtype);
    const buf = device.createBuffer({ size: Math.ceil(data.byteLength / 8) * 8, usage: usage | extra });
    device.queue.writeBuffer(buf, 0, data);
    return buf;
  };
  const cCount = count(byName.C), cBytes = Math.ceil(cCount * size / 8) * 8;
  const bufA = buffer(ops.A), bufB = buffer(ops.B);
  // unwritten = wrong: NaN, unless beta reads C (then its addend)
  const bufC = buffer(ops.C0 || new Float32Array(cCount).fill(NaN), GPUBufferUsage.COPY_SRC);
  const bufBias = ops.bias ? buffer(ops.bias) : undefined;
  const gemm = await createGemm(device, { alpha, beta });
  const readback = device.createBuffer({
    size: cBytes, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
  });
  const encoder = device.createCommandEncoder();
  gemm.encode(encoder, bufA, bufB, bufC, bufBias);
  encoder.copyBufferToBuffer(bufC, 0, readback, 0, cBytes);
  device.queue.submit([encoder.finish()]);
  await readback.mapAsync(GPUMapMode.READ);
  const raw = readback.getMappedRange().slice(0);
  const C = dtype === "f16" ? Array.from(new Uint16Array(raw, 0, cCount), fromHalf)
                            : new Float32Array(raw, 0, cCount);
  const validation = await device.popErrorScope();
  const out = dtype === "f16" ? 2 ** -10 : 0;  // the f16 output's own rounding
  const worst = worstError(C, ops, manifest, alpha, beta, out);
  const tolerance = manifest.accumulation === "f16"
    ? 2 ** -11 * 8 * (Math.sqrt(K) + 2)
    : 2 ** -24 * (16 * Math.sqrt(K) + 16);
  const errors = uncaptured.concat(validation ? [validation.message] : []);
  device.destroy();
  return { name, loaded: true, ok: errors.length === 0 && worst <= tolerance, worst, tolerance,
           errors, config: manifest.config };
}

const names = new URLSearchParams(location.search).get("bundles").split(",");
const adapter = await navigator.gpu?.requestAdapter();
if (!adapter) {
  report({ name: "*", ok: false, errors: ["no WebGPU adapter"] });
} else {
  const { vendor, architecture, device, description } = adapter.info || {};
  say("AUTOTUNE_ADAPTER", { vendor, architecture, device, description });
  for (const name of names) {
    try {
      report(await runBundle(name));
    } catch (error) {  // thrown after the module loaded (runBundle reports load errors)
      report({ name, loaded: true, ok: false, errors: [String(error)] });
    }
  }
}
console.log("AUTOTUNE_DONE");
