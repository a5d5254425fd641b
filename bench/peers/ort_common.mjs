// What the ONNX Runtime peer scripts share: onnxruntime-node from build-peers/ort, the session options, the
// entry point (telemetry off or nothing runs), and the float32 tensors of a safetensors file (inputs, reference
// logits).
import { createRequire } from 'node:module';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const peersDir = process.env.PEERS_DIR ?? path.join(here, '..', '..', 'build-peers');
export const ort = createRequire(path.join(peersDir, 'ort', 'package.json'))('onnxruntime-node');

// float32 tensors of a safetensors file, by name: { shape, data }.
export function readSafetensors(file) {
  const bytes = readFileSync(file);
  const headerLength = Number(bytes.readBigUInt64LE(0));
  const header = JSON.parse(bytes.subarray(8, 8 + headerLength).toString('utf8'));
  const tensors = {};
  for (const [name, entry] of Object.entries(header)) {
    if (name === '__metadata__') continue;
    if (entry.dtype !== 'F32') throw new Error(`${file}: ${name} is ${entry.dtype}, expected F32`);
    const [begin, end] = entry.data_offsets;
    const data = new Float32Array((end - begin) / 4);
    Buffer.from(data.buffer).set(bytes.subarray(8 + headerLength + begin, 8 + headerLength + end));
    tensors[name] = { shape: entry.shape, data };
  }
  return tensors;
}

// The tensors of a safetensors file as ONNX Runtime feeds.
export function readFeeds(file) {
  const feeds = {};
  for (const [name, tensor] of Object.entries(readSafetensors(file)))
    feeds[name] = new ort.Tensor('float32', tensor.data, tensor.shape);
  return feeds;
}

// The CPU provider with `threads` intra-op threads, one inter-op thread, sequential execution and every graph
// optimization, plus `extra` options.
export function sessionOptions(threads, extra = {}) {
  return {
    executionProviders: ['cpu'],
    intraOpNumThreads: threads,
    interOpNumThreads: 1,
    executionMode: 'sequential',
    graphOptimizationLevel: 'all',
    ...extra,
  };
}

// Runs `main` once ORT_DISABLE_TELEMETRY=1 is set (without it ONNX Runtime would try to send telemetry off the
// machine); an error ends the process with status 1, named after `script`.
export function runMain(script, main) {
  const run = async () => {
    if (process.env.ORT_DISABLE_TELEMETRY !== '1') throw new Error('run with ORT_DISABLE_TELEMETRY=1');
    await main();
  };
  run().catch((error) => {
    console.error(`${script}: ${error.message}`);
    process.exit(1);
  });
}
