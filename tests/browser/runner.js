// Runs exported autotune bundles (?bundles=name1,name2) through their own createGemm/encode
// on random data and compares C with a float64 reference. Reports on the console, with
// the JSON base64-encoded so that Chromium's quoting of console lines cannot mangle it:
//   AUTOTUNE_ADAPTER <base64 json>
//   AUTOTUNE_RESULT <base64 json>   one line per bundle
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

// Largest |C - A B| / sqrt(A^2 B^2) over all elements (float64); NaN counts as infinite.
function worstError(C, A, B, M, N, K) {
  let worst = 0;
  for (let i = 0; i < M; i++) {
    for (let j = 0; j < N; j++) {
      let sum = 0, squares = 0;
      for (let k = 0; k < K; k++) {
        const product = A[i * K + k] * B[k * N + j];
        sum += product;
        squares += product * product;
      }
      const error = Math.abs(C[i * N + j] - sum) / Math.max(Math.sqrt(squares), 1e-300);
      if (!(error <= worst)) worst = Number.isNaN(error) ? Infinity : error;
    }
  }
  return worst;
}

async function runBundle(name) {
  const { createGemm, manifest } = await import(`./${name}.js`);
  const adapter = await navigator.gpu.requestAdapter();  // an adapter gives one device
  const device = await adapter.requestDevice({ requiredLimits: manifest.required_limits });
  const uncaptured = [];
  device.addEventListener("uncapturederror", (event) => uncaptured.push(event.error.message));
  device.pushErrorScope("validation");
  const { M, N, K } = manifest.shape;
  const A = randomMatrix(M * K, 7 + M), B = randomMatrix(K * N, 11 + N);
  const usage = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_DST;
  const bufA = device.createBuffer({ size: A.byteLength, usage });
  const bufB = device.createBuffer({ size: B.byteLength, usage });
  const bufC = device.createBuffer({ size: M * N * 4, usage: usage | GPUBufferUsage.COPY_SRC });
  device.queue.writeBuffer(bufA, 0, A);
  device.queue.writeBuffer(bufB, 0, B);
  device.queue.writeBuffer(bufC, 0, new Float32Array(M * N).fill(NaN));  // unwritten = wrong
  const gemm = await createGemm(device);
  const readback = device.createBuffer({
    size: M * N * 4, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
  });
  const encoder = device.createCommandEncoder();
  gemm.encode(encoder, bufA, bufB, bufC);
  encoder.copyBufferToBuffer(bufC, 0, readback, 0, M * N * 4);
  device.queue.submit([encoder.finish()]);
  await readback.mapAsync(GPUMapMode.READ);
  const C = new Float32Array(readback.getMappedRange().slice(0));
  const validation = await device.popErrorScope();
  const worst = worstError(C, A, B, M, N, K);
  const tolerance = 2 ** -24 * (16 * Math.sqrt(K) + 16);
  const errors = uncaptured.concat(validation ? [validation.message] : []);
  device.destroy();
  return { name, ok: errors.length === 0 && worst <= tolerance, worst, tolerance, errors,
           config: manifest.config };
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
    } catch (error) {
      report({ name, ok: false, errors: [String(error)] });
    }
  }
}
console.log("AUTOTUNE_DONE");
