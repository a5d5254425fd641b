// Times an ONNX model with ONNX Runtime (onnxruntime-node, CPU execution provider).
//
//   ORT_DISABLE_TELEMETRY=1 node bench_ort.mjs MODEL.onnx INPUTS.safetensors [--threads 1,2] [--iters N]
//       [--warmup N] [--reference LOGITS.safetensors]
//
// One session per thread count (intra-op threads N, inter-op 1, sequential execution, all graph optimizations);
// prints one JSON object per line: threads, min_ms, median_ms, max_ms, and max_abs_diff against the reference.
import { ort, readFeeds, readSafetensors, runMain, sessionOptions } from './ort_common.mjs';

function parseArgs(argv) {
  const options = { threads: [1, 2], iters: 20, warmup: 3, reference: null, positionals: [] };
  for (let i = 0; i < argv.length; ++i) {
    const arg = argv[i];
    const value = () => {
      if (i + 1 >= argv.length) throw new Error(`option '${arg}' needs a value`);
      return argv[++i];
    };
    if (arg === '--threads') options.threads = value().split(',').map(Number);
    else if (arg === '--iters') options.iters = Number(value());
    else if (arg === '--warmup') options.warmup = Number(value());
    else if (arg === '--reference') options.reference = value();
    else if (arg.startsWith('--')) throw new Error(`unknown option '${arg}'`);
    else options.positionals.push(arg);
  }
  if (options.positionals.length !== 2) throw new Error('expected MODEL.onnx INPUTS.safetensors');
  return options;
}

async function timeSession(modelPath, feeds, threads, options) {
  const createStart = process.hrtime.bigint();
  const session = await ort.InferenceSession.create(modelPath, sessionOptions(threads));
  const createMs = Number(process.hrtime.bigint() - createStart) / 1e6;
  let outputs;
  for (let i = 0; i < options.warmup; ++i) outputs = await session.run(feeds);
  const ms = [];
  for (let i = 0; i < options.iters; ++i) {
    const start = process.hrtime.bigint();
    outputs = await session.run(feeds);
    ms.push(Number(process.hrtime.bigint() - start) / 1e6);
  }
  ms.sort((a, b) => a - b);
  const result = { runner: 'onnxruntime', version: ort.env.versions?.common ?? 'unknown', threads,
                   iters: options.iters, min_ms: ms[0], median_ms: ms[Math.floor(ms.length / 2)],
                   max_ms: ms[ms.length - 1], create_ms: createMs };
  if (options.reference) {
    const reference = Object.values(readSafetensors(options.reference))[0].data;
    const output = outputs[session.outputNames[0]].data;
    let diff = 0;
    for (let i = 0; i < reference.length; ++i) diff = Math.max(diff, Math.abs(output[i] - reference[i]));
    result.max_abs_diff = diff;
  }
  await session.release();
  return result;
}

async function main() {
  const options = parseArgs(process.argv.slice(2));
  const [modelPath, inputsPath] = options.positionals;
  const feeds = readFeeds(inputsPath);
  for (const threads of options.threads)
    console.log(JSON.stringify(await timeSession(modelPath, feeds, threads, options)));
}

runMain('bench_ort', main);
