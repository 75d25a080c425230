// The `model init`, `tokenize` and `detokenize` subcommands' flags.
#include <iostream>
#include <memory>

#include "commands.h"
#include "engine_flags.h"
#include "lockstep/harness/model_init.h"
#include "lockstep/harness/tokenize_command.h"

namespace lockstep::cli {

// ---- model init ----
void AddModelInit(CLI::App& app, std::vector<Command>& commands) {
  auto* model = app.add_subcommand("model", "Model files");
  model->require_subcommand(1);
  auto* init =
      model->add_subcommand("init", "Write a seeded synthetic Qwen3-Next model (HF layout)");
  struct State {
    lockstep::SyntheticOptions syn;
    std::string out_dir, dtype, tokenizer, format = "safetensors", quant;
    bool no_mtp = false;
  };
  auto st = std::make_shared<State>();
  init->add_option("--preset", st->syn.preset, "tiny | small | seed48 | wide")
      ->required()
      ->group(kGroupModel);
  init->add_option("--seed", st->syn.seed, "Weight seed (same seed, byte-identical files)")
      ->capture_default_str()
      ->group(kGroupModel);
  init->add_option("--out", st->out_dir, "Output folder")->required()->group(kGroupModel);
  init->add_option("--dtype", st->dtype, "Matrix storage dtype: f32 | bf16 | f16")
      ->default_str("f32 for tiny, bf16 others")
      ->group(kGroupModel);
  init->add_option("--format", st->format,
                   "safetensors (HF layout) | gguf (llama.cpp's qwen3next layout, DIR/model.gguf)")
      ->capture_default_str()
      ->group(kGroupModel);
  init->add_option("--quant", st->quant,
                   "GGUF only: quantise matrices to a ggml block type (q4_0 .. q8_0, q2_k .. "
                   "q6_k, iq4_nl, iq4_xs, iq3_s, iq3_xxs, iq2_xxs, iq2_xs, iq2_s, iq1_s, iq1_m, "
                   "tq1_0, tq2_0)")
      ->default_str("none")
      ->group(kGroupModel);
  init->add_flag("--no-mtp", st->no_mtp, "Omit the mtp.* tensors")->group(kGroupModel);
  init->add_flag("--induction", st->syn.induction,
                 "Wire induction heads: the model continues repeated text")
      ->group(kGroupModel);
  // The preset cut in depth and breadth, its widths kept (e.g. `wide` in 4 layers on a small GPU).
  init->add_option("--layers", st->syn.n_layers,
                   "Layers instead of the preset's (full attention every 4th)")
      ->check(CLI::Range(1, 1 << 24))
      ->default_str("preset")
      ->group(kGroupPipeline);
  init->add_option("--experts", st->syn.n_experts,
                   "Routed experts per MoE layer instead of the preset's")
      ->check(CLI::Range(1, 1 << 24))
      ->default_str("preset")
      ->group(kGroupPipeline);
  init->add_option("--experts-used", st->syn.n_experts_used,
                   "Experts per token instead of the preset's")
      ->check(CLI::Range(1, 1 << 24))
      ->default_str("preset")
      ->group(kGroupPipeline);
  init->add_option("--vocab", st->syn.n_vocab, "Vocabulary size instead of the preset's")
      ->check(CLI::Range(1, 1 << 24))
      ->default_str("preset")
      ->group(kGroupPipeline);
  init->add_option(
          "--tokenizer", st->tokenizer,
          "Copy this tokenizer.json into the model (GGUF: as tokenizer.ggml.*; needs --vocab above "
          "its largest id)")
      ->type_name("FILE")
      ->group(kGroupModel);
  init->footer(
      "Examples:\n"
      "  lockstep model init --preset tiny --seed 7 --out m\n"
      "  lockstep model init --preset wide --layers 4 --dtype bf16 --out wide4\n"
      "  lockstep model init --preset tiny --vocab 151936 --tokenizer tokenizer.json --out mq\n"
      "  lockstep model init --preset small --format gguf --quant q4_k --out small-q4");
  commands.push_back(
      {init, [st]() -> Status {
         if (!st->dtype.empty()) {
           LOCKSTEP_ASSIGN_OR_RETURN(st->syn.dtype, lockstep::ParseModelDtype(st->dtype));
         }
         st->syn.with_mtp = !st->no_mtp;
         LOCKSTEP_ASSIGN_OR_RETURN(lockstep::ModelFormat format,
                                   lockstep::ParseModelFormat(st->format, st->quant));
         return lockstep::RunModelInit(st->syn, st->out_dir, std::cout, format, st->tokenizer);
       }});
}

// ---- tokenize / detokenize ----
void AddTokenize(CLI::App& app, std::vector<Command>& commands) {
  auto tk = std::make_shared<lockstep::TokenizeOptions>();
  auto* tok = app.add_subcommand("tokenize", "Print the ids the model's tokenizer gives a text");
  tok->add_option("TEXT", tk->text, "Text to encode (UTF-8)");
  tok->add_option(
         "--model", tk->model,
         "Model folder (its tokenizer.json) or FILE.gguf (its vocabulary), else byte level")
      ->required()
      ->group(kGroupModel);
  tok->add_option("--file", tk->file, "Encode this file's bytes instead of TEXT")
      ->group(kGroupRequest);
  tok->add_option("--json", tk->json, "Write a JSON object (tokenizer, ids) instead")
      ->type_name("PATH|-")
      ->group(kGroupReports);
  tok->footer(
      "Examples:\n"
      "  lockstep tokenize --model m 'Hello, world'\n"
      "  lockstep tokenize --model m --file prompt.txt > prompt.ids\n"
      "  lockstep tokenize --model m --json - '<|im_start|>user'");
  commands.push_back({tok, [tk]() -> Status { return lockstep::RunTokenize(*tk, std::cout); }});

  auto dt = std::make_shared<lockstep::DetokenizeOptions>();
  auto* det = app.add_subcommand("detokenize", "Print the text of token ids");
  det->add_option("IDS", dt->ids, "Ids, whitespace or comma separated (quote them)");
  det->add_option(
         "--model", dt->model,
         "Model folder (its tokenizer.json) or FILE.gguf (its vocabulary), else byte level")
      ->required()
      ->group(kGroupModel);
  det->add_option("--file", dt->file, "Read the ids from this file instead")->group(kGroupRequest);
  det->add_option("--json", dt->json, "Write a JSON object (tokenizer, text) instead")
      ->type_name("PATH|-")
      ->group(kGroupReports);
  det->footer(
      "Examples:\n"
      "  lockstep detokenize --model m '9707 11 1879'\n"
      "  lockstep detokenize --model m --file prompt.ids --json -");
  commands.push_back({det, [dt]() -> Status { return lockstep::RunDetokenize(*dt, std::cout); }});
}

}  // namespace lockstep::cli
