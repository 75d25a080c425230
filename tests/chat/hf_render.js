// Hugging Face's own Jinja (npm @huggingface/jinja) on each conversation:
//   node hf_render.js TOKENIZER_CONFIG_JSON CONVERSATIONS_JSONL OUT_JSONL
// One {"text"} or {"error"} a line, rendered as transformers' apply_chat_template does: the
// template with messages, add_generation_prompt, enable_thinking and tools when the line has
// them, and the config's special tokens. NODE_PATH names setup_hf.sh's node_modules.
const fs = require('fs');

async function main() {
  const { Template } = require('@huggingface/jinja');
  const [cfgPath, convPath, outPath] = process.argv.slice(2);
  const cfg = JSON.parse(fs.readFileSync(cfgPath, 'utf8'));
  const template = new Template(cfg.chat_template);
  const special = {};
  for (const k of ['bos_token', 'eos_token', 'pad_token', 'unk_token']) {
    const v = cfg[k];
    if (typeof v === 'string') special[k] = v;
    else if (v && typeof v.content === 'string') special[k] = v.content;
  }
  const out = [];
  for (const line of fs.readFileSync(convPath, 'utf8').split('\n')) {
    if (!line) continue;
    const c = JSON.parse(line);
    const vars = { ...special, messages: c.messages, add_generation_prompt: c.add_generation_prompt };
    if ('enable_thinking' in c) vars.enable_thinking = c.enable_thinking;
    if ('tools' in c) vars.tools = c.tools;
    try {
      out.push(JSON.stringify({ text: template.render(vars) }));
    } catch (e) {
      out.push(JSON.stringify({ error: String(e.message || e) }));
    }
  }
  fs.writeFileSync(outPath, out.join('\n') + '\n');
}
main().catch((e) => { console.error(e); process.exit(1); });
