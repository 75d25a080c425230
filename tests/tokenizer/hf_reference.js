// Hugging Face's tokenizers (the npm package `tokenizers`, Rust through N-API) on the corpus:
//   node hf_reference.js ids  TOKENIZER_JSON CORPUS_JSONL OUT_JSONL   one {"ids", "decoded"} a line
//   node hf_reference.js time TOKENIZER_JSON CORPUS_JSONL [REPEATS]   {"encode_s", "batch_s", ...}
// NODE_PATH names the node_modules folder setup_hf.sh installed into. `time` reports the best of
// REPEATS passes (after one warm-up) of encode() awaited string by string, and of one
// encodeBatch() over the corpus (run with RAYON_NUM_THREADS=1 for a single-threaded figure), and
// cold_batch_s: one encodeBatch() by a freshly loaded tokenizer (its word cache empty).
const fs = require('fs');
const { Tokenizer } = require('tokenizers');

async function main() {
  const [mode, tokPath, corpusPath, arg] = process.argv.slice(2);
  const tok = Tokenizer.fromFile(tokPath);
  const texts = fs.readFileSync(corpusPath, 'utf8').split('\n').filter((l) => l.length > 0)
      .map((l) => JSON.parse(l).text);
  if (mode === 'ids') {
    const out = [];
    for (const t of texts) {
      const ids = (await tok.encode(t)).getIds();
      out.push(JSON.stringify({ ids, decoded: await tok.decode(ids, false) }));
    }
    fs.writeFileSync(arg, out.join('\n') + '\n');
    return;
  }
  const repeats = Number(arg || 3);
  let bytes = 0;
  for (const t of texts) bytes += Buffer.byteLength(t, 'utf8');
  let best = Infinity, bestBatch = Infinity, tokens = 0, firstBatch = 0;
  for (let r = 0; r <= repeats; ++r) {
    let t0 = process.hrtime.bigint();
    tokens = 0;
    for (const t of texts) tokens += (await tok.encode(t)).getIds().length;
    const s = Number(process.hrtime.bigint() - t0) / 1e9;
    t0 = process.hrtime.bigint();
    if (r === 0) {  // a cold pass first: a fresh tokenizer, nothing cached
      const fresh = Tokenizer.fromFile(tokPath);
      const t1 = process.hrtime.bigint();
      await fresh.encodeBatch(texts);
      firstBatch = Number(process.hrtime.bigint() - t1) / 1e9;
      t0 = process.hrtime.bigint();
    }
    await tok.encodeBatch(texts);
    const sb = Number(process.hrtime.bigint() - t0) / 1e9;
    if (r > 0) best = Math.min(best, s), bestBatch = Math.min(bestBatch, sb);  // r = 0 warms up
  }
  console.log(JSON.stringify({ strings: texts.length, bytes, tokens, encode_s: best,
                               batch_s: bestBatch, cold_batch_s: firstBatch, repeats }));
}
main().catch((e) => { console.error(e); process.exit(1); });
