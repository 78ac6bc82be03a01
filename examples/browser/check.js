// The correctness check of an exported GEMM bundle, shared by the demo page and the
// project's browser tests: random data, the kernel run through its own encode, and C
// compared with a float64 reference computed here.

export function randomMatrix(count, seed) {
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
export function toHalf(value) {
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
export function fromHalf(h) {
  const sign = h & 0x8000 ? -1 : 1, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  if (exp === 0) return sign * man * 2 ** -24;
  if (exp === 0x1f) return man ? NaN : sign * Infinity;
  return sign * (1 + man / 1024) * 2 ** (exp - 15);
}

// Values in memory (Float32Array) and their bytes in the kernel's dtype.
export function upload(values, dtype) {
  if (dtype === "f32") return values;
  const half = new Uint16Array(values.length + (values.length % 2));  // whole 4-byte words
  for (let i = 0; i < values.length; i++) half[i] = toHalf(values[i]);
  return half;
}
export const quantize = (values) => values.map((v) => Math.round(v * 256) / 256);

// The manifest's problem in float64: op(A) op(B) per batch item, then the epilogue.
// Returns the largest (|C - R| - out |R|) / scale, scale = |alpha| sqrt(sum of squared
// products) + |beta C0| + |bias| (through the activation's slope); NaN is infinite.
export function worstError(C, ops, m, alpha, beta, out) {
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

// The alpha and beta the check uses: createGemm(device, scalarsOf(manifest)).
export function scalarsOf(manifest) {
  const epilogue = manifest.epilogue.ops;
  return { alpha: epilogue.includes("alpha") ? 0.75 : 1, beta: epilogue.includes("beta") ? -0.5 : 0 };
}

// Runs `gemm` (createGemm's result, made with scalarsOf) once on random data of its manifest's problem and
// compares C with a float64 reference: { ok, worst, tolerance }, worst the largest error
// in units of the result's scale (worstError).
export async function checkGemm(device, gemm) {
  const manifest = gemm.manifest;
  const { M, N, K } = manifest.shape;
  const dtype = manifest.dtype, size = dtype === "f16" ? 2 : 4;
  const count = (binding) => binding.shape.reduce((x, y) => x * y, 1);
  const byName = Object.fromEntries(manifest.buffers.map((b) => [b.name, b]));
  const ops = {
    A: quantize(randomMatrix(count(byName.A), 7 + M)),
    B: quantize(randomMatrix(count(byName.B), 11 + N)),
  };
  const epilogue = manifest.epilogue.ops;
  const { alpha, beta } = scalarsOf(manifest);
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
  const out = dtype === "f16" ? 2 ** -10 : 0;  // the f16 output's own rounding
  const worst = worstError(C, ops, manifest, alpha, beta, out);
  const tolerance = manifest.accumulation === "f16"
    ? 2 ** -11 * 8 * (Math.sqrt(K) + 2)
    : 2 ** -24 * (16 * Math.sqrt(K) + 16);
  for (const buf of [bufA, bufB, bufC, bufBias, readback]) buf?.destroy();
  return { ok: worst <= tolerance, worst, tolerance };
}


// A device for a candidate set: the features any candidate needs that the adapter has,
// with "timestamp-query" where it has it (createGemm times with it; timestamps: false
// leaves it out, to time by the wall clock), and the limits the candidates ask for, as
// far as the adapter goes (a candidate beyond them is skipped by createGemm).
export async function requestDeviceFor(adapter, manifests, { timestamps = true } = {}) {
  const wanted = manifests.flatMap((m) => m.required_features)
    .concat(timestamps ? ["timestamp-query"] : []);
  const requiredFeatures = [...new Set(wanted)].filter((f) => adapter.features.has(f));
  const requiredLimits = {};
  for (const m of manifests) {
    for (const [name, value] of Object.entries(m.required_limits)) {
      requiredLimits[name] = Math.min(Math.max(requiredLimits[name] ?? 0, value),
                                      adapter.limits[name]);
    }
  }
  return await adapter.requestDevice({ requiredFeatures, requiredLimits });
}
