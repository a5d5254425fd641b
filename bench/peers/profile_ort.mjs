// ONNX Runtime's own per-node times (onnxruntime-node's profiler), the minimum of each node over the runs, in
// execution order: what to set against npusim's per-kernel times node by node.
//
//   ORT_DISABLE_TELEMETRY=1 node profile_ort.mjs MODEL.onnx INPUTS.safetensors [--threads N] [--iters N]
//
// Same session options as bench_ort.mjs (CPU provider, intra-op threads N, sequential, all graph optimizations).
// Prints one line per node: name, op type, minimum ms; then the sum of the minima.
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';

import { ort, readFeeds, runMain, sessionOptions } from './ort_common.mjs';

function parseArgs(argv) {
  const options = { threads: 1, iters: 20, positionals: [] };
  for (let i = 0; i < argv.length; ++i) {
    const arg = argv[i];
    const value = () => {
      if (i + 1 >= argv.length) throw new Error(`option '${arg}' needs a value`);
      return argv[++i];
    };
    const positive = (text) => {
      const number = Number(text);
      if (!Number.isInteger(number) || number < 1) throw new Error(`option '${arg}' needs a positive integer`);
      return number;
    };
    if (arg === '--threads') options.threads = positive(value());
    else if (arg === '--iters') options.iters = positive(value());
    else if (arg.startsWith('--')) throw new Error(`unknown option '${arg}'`);
    else options.positionals.push(arg);
  }
  if (options.positionals.length !== 2) throw new Error('expected MODEL.onnx INPUTS.safetensors');
  return options;
}

async function main() {
  const options = parseArgs(process.argv.slice(2));
  const [modelPath, inputsPath] = options.positionals;
  const feeds = readFeeds(inputsPath);
  const profileDir = mkdtempSync(path.join(os.tmpdir(), 'npusim-ort-profile-'));
  try {
    const session = await ort.InferenceSession.create(
        modelPath,
        sessionOptions(options.threads, { enableProfiling: true, profileFilePrefix: path.join(profileDir, 'ort') }));
    for (let i = 0; i < options.iters; ++i) await session.run(feeds);
    session.endProfiling();
    await session.release();
    const files = readdirSync(profileDir).filter((name) => name.endsWith('.json'));
    if (files.length !== 1) throw new Error(`expected one profile file in ${profileDir}, found ${files.length}`);
    const events = JSON.parse(readFileSync(path.join(profileDir, files[0]), 'utf8'));
    const fastest = new Map();  // in first-seen order: execution order
    for (const event of events) {
      if (event.cat !== 'Node' || !event.name.endsWith('_kernel_time')) continue;
      const key = `${event.name.slice(0, -'_kernel_time'.length)}\t${event.args?.op_name ?? '?'}`;
      fastest.set(key, Math.min(fastest.get(key) ?? Infinity, event.dur));
    }
    let total = 0;
    for (const [key, us] of fastest) {
      console.log(`${key}\t${(us / 1000).toFixed(3)}`);
      total += us;
    }
    console.log(`sum of minima\t\t${(total / 1000).toFixed(3)} ms over ${fastest.size} nodes, ${options.iters} runs, ` +
                `${options.threads} thread(s)`);
  } finally {
    rmSync(profileDir, { recursive: true, force: true });
  }
}

runMain('profile_ort', main);
