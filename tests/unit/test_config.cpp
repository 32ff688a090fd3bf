// The TOML run config: defaults, every error names its key, and the shipped configs parse.
#include <gtest/gtest.h>

#include "core/config.h"
#include "core/error.h"

using namespace df;

namespace {

const char* kMinimal = R"(
[target]
random_config = "configs/tiny-target.json"
device = "cpu"
[drafter]
mask_token_id = 255
)";

std::string error_of(const std::string& text) {
  try {
    config_parse(text, "test.toml");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Config, MinimalGetsDefaults) {
  Config c = config_parse(kMinimal, "test.toml");
  EXPECT_EQ(c.drafter.block_size, 16);
  EXPECT_EQ(c.drafter.num_anchors, 512);
  EXPECT_DOUBLE_EQ(c.train.lr, 6e-4);
  EXPECT_EQ(c.train.loss, "ce");
  EXPECT_EQ(c.target.device, "cpu");
  bool found = false;
  for (const auto& [k, v] : c.values)
    if (k == "drafter.mask_token_id") found = (v == "255");
  EXPECT_TRUE(found);
}

TEST(Config, UnknownKeyIsNamed) {
  std::string e = error_of(std::string(kMinimal) + "[train]\nlearning_rate = 1e-3\n");
  EXPECT_NE(e.find("unknown key 'train.learning_rate'"), std::string::npos) << e;
  e = error_of(std::string(kMinimal) + "[trian]\nlr = 1e-3\n");
  EXPECT_NE(e.find("'trian'"), std::string::npos) << e;
}

TEST(Config, WrongTypeIsNamed) {
  std::string e = error_of(std::string(kMinimal) + "[train]\nlr = \"fast\"\n");
  EXPECT_NE(e.find("'train.lr' must be a number"), std::string::npos) << e;
  e = error_of(std::string(kMinimal) + "[data]\ntoken_budget = 1.5\n");
  EXPECT_NE(e.find("'data.token_budget' must be an integer"), std::string::npos) << e;
  e = error_of(std::string(kMinimal) + "[data]\ntrain = \"a.h5\"\n");
  EXPECT_NE(e.find("'data.train' must be an array"), std::string::npos) << e;
}

TEST(Config, InvalidValuesAreNamed) {
  EXPECT_NE(error_of(std::string(kMinimal) + "[train]\nloss = \"mse\"\n").find("train.loss"), std::string::npos);
  EXPECT_NE(error_of(std::string(kMinimal) + "[train]\nwarmup_ratio = 1.5\n").find("train.warmup_ratio"),
            std::string::npos);
  EXPECT_NE(error_of("[target]\nrandom_config = \"x\"\n").find("drafter.mask_token_id"), std::string::npos);
  EXPECT_NE(error_of("[drafter]\nmask_token_id = 3\n").find("target.model"), std::string::npos);
  std::string e = error_of(std::string(kMinimal) + "[pipeline]\nhs_queue_depth = 0\n");
  EXPECT_NE(e.find("pipeline.hs_queue_depth"), std::string::npos) << e;
  // A budget past the bound is named, not multiplied into drafter.max_block_rows first (a fuzz finding: 4 x a
  // budget near 2^62 overflowed int64).
  for (const char* budget : {"0", "-5", "1073741825", "3333333333233238458"}) {
    e = error_of(std::string(kMinimal) + "[data]\ntoken_budget = " + budget + "\n");
    EXPECT_NE(e.find("'data.token_budget' must be in [1, 1073741824]"), std::string::npos) << budget << ": " << e;
  }
  EXPECT_EQ(error_of(std::string(kMinimal) + "[data]\ntoken_budget = 1073741824\n"), "");
  e = error_of(std::string(kMinimal) + "max_block_rows = 9223372036854775807\n");
  EXPECT_NE(e.find("'drafter.max_block_rows' must be 0"), std::string::npos) << e;
  e = error_of(std::string(kMinimal) + "[train]\nloss = \"dpace\"\ndpace_alpha = 1.5\n");
  EXPECT_NE(e.find("train.dpace_alpha"), std::string::npos) << e;
  e = error_of(std::string(kMinimal) + "[train]\nloss = \"dpace\"\nstreak = true\n");
  EXPECT_NE(e.find("train.streak"), std::string::npos) << e;
  for (const char* loss : {"dpace", "dpace-cumulative-confidence-only", "dpace-continuation-value-only"})
    EXPECT_EQ(error_of(std::string(kMinimal) + "[train]\nloss = \"" + loss + "\"\n"), "") << loss;
  // No CUDA kernel for the D-PACE weights: a CUDA drafter refuses the loss up front, naming the key and the fix.
  e = error_of("[target]\nrandom_config = \"configs/tiny-target.json\"\ndevice = \"cpu\"\n[drafter]\n"
               "mask_token_id = 255\ndevice = \"cuda\"\n[train]\nloss = \"dpace-continuation-value-only\"\n");
  EXPECT_NE(e.find("train.loss"), std::string::npos) << e;
  EXPECT_NE(e.find("HINT: drafter.device = \"cpu\""), std::string::npos) << e;
}

TEST(Config, SyntaxErrorHasLine) {
  std::string e = error_of("[run\nseed = 1\n");
  EXPECT_NE(e.find("test.toml:1:"), std::string::npos) << e;
  EXPECT_NE(e.find("TOML syntax error"), std::string::npos) << e;
}

TEST(Config, MissingFileSaysWhatToDo) {
  try {
    config_load("/nonexistent/x.toml");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/x.toml"), std::string::npos);
  }
}

// drafter.device follows target.device unless set; the block-row cap defaults to 4 x the token budget and
// the table shows the value in force.
TEST(Config, DrafterDeviceAndBlockRowCap) {
  Config c = config_parse(kMinimal, "test.toml");
  EXPECT_EQ(c.drafter.device, "cpu");
  EXPECT_EQ(c.drafter.max_block_rows, 4 * c.data.token_budget);
  EXPECT_NE(config_table(c).find("drafter.max_block_rows"), std::string::npos);
  EXPECT_NE(config_table(c).find("131072 (4 x data.token_budget)"), std::string::npos) << config_table(c);
  EXPECT_NE(config_table(c).find("drafter.device"), std::string::npos);
  Config g =
      config_parse("[target]\nrandom_config = \"x.json\"\n[drafter]\nmask_token_id = 1\n", "test.toml");
  EXPECT_EQ(g.drafter.device, "cuda");  // target.device's default
  Config d = config_parse(std::string(kMinimal) + "device = \"cuda\"\nmax_block_rows = 0\n", "test.toml");
  EXPECT_EQ(d.drafter.device, "cuda");
  EXPECT_EQ(d.drafter.max_block_rows, 0);
  std::string e = error_of(std::string(kMinimal) + "device = \"gpu\"\n");
  EXPECT_NE(e.find("drafter.device"), std::string::npos) << e;
  e = error_of(std::string(kMinimal) + "max_block_rows = 15\n");  // below one block of 16
  EXPECT_NE(e.find("drafter.max_block_rows"), std::string::npos) << e;
  e = error_of(std::string(kMinimal) + "max_block_rows = \"many\"\n");
  EXPECT_NE(e.find("drafter.max_block_rows"), std::string::npos) << e;
}

TEST(Config, ShippedConfigsChooseTheDrafterDevice) {
  EXPECT_EQ(config_load(std::string(DF_SOURCE_DIR) + "/configs/tiny.toml").drafter.device, "cpu");
  for (const char* f : {"qwen3.6-27b.toml", "qwen3-8b.toml", "qwen3-8b-dflash2.toml", "qwen3.6-35b-a3b.toml"}) {
    Config c = config_load(std::string(DF_SOURCE_DIR) + "/configs/" + f);
    EXPECT_EQ(c.drafter.device, "cuda") << f;
    EXPECT_EQ(c.drafter.max_block_rows, 8192) << f;
  }
}

// The Domino recipes carry SpecForge a6b6b023's settings: configs/qwen3-8b-domino.json and
// qwen3.6-27b-domino-full-attention.json for the model, examples/configs/*-domino-online.yaml for the
// training.
TEST(Config, DominoRecipesMirrorSpecForge) {
  for (const auto& [f, shift] : {std::pair<const char*, bool>{"qwen3-8b-domino.toml", true},
                                 std::pair<const char*, bool>{"qwen3.6-27b-domino.toml", false}}) {
    const Config c = config_load(std::string(DF_SOURCE_DIR) + "/configs/" + f);
    const DrafterSection& d = c.drafter;
    EXPECT_EQ(d.kind, "domino") << f;
    EXPECT_EQ(d.pure_draft_prefix_len, 1) << f;
    EXPECT_EQ(d.emb_dim, 256) << f;
    EXPECT_EQ(d.gru_hidden_dim, 1024) << f;
    EXPECT_EQ(d.shift_label, shift) << f;
    EXPECT_EQ(d.layers, 5) << f;
    EXPECT_EQ(d.layer_types, std::vector<std::string>(5, "full_attention")) << f;
    EXPECT_EQ(d.block_size, 16) << f;
    EXPECT_EQ(d.num_anchors, 256) << f;
    EXPECT_EQ(c.train.loss, "ce") << f;
    EXPECT_EQ(c.train.gamma, 7.0) << f;
    EXPECT_EQ(c.train.lr, 6e-4) << f;
    EXPECT_EQ(c.train.epochs, 6.0) << f;
    EXPECT_EQ(c.train.warmup_ratio, 0.04) << f;
    EXPECT_EQ(c.train.clip, 1.0) << f;
    EXPECT_EQ(c.train.lambda_base_start, 1.0) << f;
    EXPECT_EQ(c.train.lambda_base_decay_ratio, 1.0) << f;
  }
  EXPECT_EQ(config_load(std::string(DF_SOURCE_DIR) + "/configs/qwen3-8b-domino.toml").drafter.mask_token_id,
            151669);
  const Config q27 = config_load(std::string(DF_SOURCE_DIR) + "/configs/qwen3.6-27b-domino.toml");
  EXPECT_EQ(q27.drafter.mask_token_id, 248070);
  EXPECT_EQ(q27.drafter.target_layer_ids, (std::vector<int>{1, 16, 31, 46, 61}));
  const Config tiny = config_load(std::string(DF_SOURCE_DIR) + "/configs/tiny-domino.toml");
  EXPECT_EQ(tiny.drafter.kind, "domino");
  EXPECT_EQ(tiny.drafter.device, "cpu");
}

TEST(Config, DrafterKindAndItsKeys) {
  Config c = config_parse(kMinimal, "test.toml");
  EXPECT_EQ(c.drafter.kind, "dflash");
  bool domino_key_shown = false;
  for (const auto& [k, v] : c.values)
    domino_key_shown |= k == "drafter.emb_dim" || k == "train.lambda_base_start";
  EXPECT_FALSE(domino_key_shown) << "a DFlash run's table lists no Domino key";

  c = config_parse(
      std::string(kMinimal) +
          "kind = \"domino\"\nemb_dim = 64\ngru_hidden_dim = 96\npure_draft_prefix_len = 2\n"
          "shift_label = false\n[train]\nlambda_base_start = 0.8\nlambda_base_decay_ratio = 0.25\n",
      "test.toml");
  EXPECT_EQ(c.drafter.kind, "domino");
  EXPECT_EQ(c.drafter.emb_dim, 64);
  EXPECT_EQ(c.drafter.gru_hidden_dim, 96);
  EXPECT_EQ(c.drafter.pure_draft_prefix_len, 2);
  EXPECT_FALSE(c.drafter.shift_label);
  EXPECT_DOUBLE_EQ(c.train.lambda_base_start, 0.8);
  EXPECT_DOUBLE_EQ(c.train.lambda_base_decay_ratio, 0.25);
  const std::string table = config_table(c);
  for (const char* shown :
       {"drafter.kind", "\"domino\"", "drafter.gru_hidden_dim", "train.lambda_base_decay_ratio"})
    EXPECT_NE(table.find(shown), std::string::npos) << shown << "\n" << table;

  // SpecForge's defaults (configs/qwen3-8b-domino.json, schema.py).
  c = config_parse(std::string(kMinimal) + "kind = \"domino\"\n", "test.toml");
  EXPECT_EQ(c.drafter.emb_dim, 256);
  EXPECT_EQ(c.drafter.gru_hidden_dim, 1024);
  EXPECT_EQ(c.drafter.pure_draft_prefix_len, 1);
  EXPECT_TRUE(c.drafter.shift_label);
  EXPECT_DOUBLE_EQ(c.train.lambda_base_start, 1.0);
  EXPECT_DOUBLE_EQ(c.train.lambda_base_decay_ratio, 0.5);
}

TEST(Config, KeyOfAnotherKindIsRefusedNamingIt) {
  for (const char* extra :
       {"emb_dim = 64\n", "gru_hidden_dim = 8\n", "shift_label = true\n", "pure_draft_prefix_len = 1\n"}) {
    const std::string e = error_of(std::string(kMinimal) + extra);
    const std::string key = std::string(extra).substr(0, std::string(extra).find(' '));
    EXPECT_NE(e.find("'drafter." + key + "' belongs to drafter.kind = \"domino\""), std::string::npos) << e;
  }
  const std::string e = error_of(std::string(kMinimal) + "[train]\nlambda_base_start = 0.5\n");
  EXPECT_NE(
      e.find(
          "'train.lambda_base_start' belongs to drafter.kind = \"domino\", but drafter.kind is \"dflash\""),
      std::string::npos)
      << e;
  EXPECT_NE(error_of(std::string(kMinimal) + "kind = \"eagle\"\n").find("'drafter.kind' = \"eagle\""),
            std::string::npos);
}

TEST(Config, DominoTrainsWithCeOnlyAndKeepsACorrectedSlot) {
  const std::string domino = std::string(kMinimal) + "kind = \"domino\"\n";
  for (const char* loss : {"kl", "dpace"}) {
    const std::string e = error_of(domino + "[train]\nloss = \"" + loss + "\"\n");
    EXPECT_NE(
        e.find("'train.loss' = \"" + std::string(loss) + "\": drafter.kind = \"domino\" trains with CE only"),
        std::string::npos)
        << e;
  }
  EXPECT_NE(error_of(domino + "[train]\nstreak = true\n").find("'train.streak'"), std::string::npos);
  EXPECT_NE(
      error_of(domino + "block_size = 4\npure_draft_prefix_len = 4\n").find("drafter.pure_draft_prefix_len"),
      std::string::npos);
  EXPECT_NE(error_of(domino + "block_size = 4\npure_draft_prefix_len = 3\nshift_label = false\n")
                .find("drafter.pure_draft_prefix_len"),
            std::string::npos);
  EXPECT_EQ(error_of(domino + "block_size = 4\npure_draft_prefix_len = 3\n"), "");
  EXPECT_NE(error_of(domino + "gru_hidden_dim = 0\n").find("drafter.gru_hidden_dim"), std::string::npos);
  EXPECT_NE(error_of(domino + "emb_dim = -1\n").find("drafter.emb_dim"), std::string::npos);
  EXPECT_NE(error_of(domino + "[train]\nlambda_base_start = 1.5\n").find("train.lambda_base_start"),
            std::string::npos);
}

TEST(Config, Dflash2KeysTheirDefaultsAndRefusals) {
  const std::string dflash2 = std::string(kMinimal) + "kind = \"dflash2\"\n";
  // SpecForge's published recipe (configs/qwen3.6-27b-dflash2.json) and its schema's selector-loss defaults.
  Config c = config_parse(dflash2, "test.toml");
  EXPECT_EQ(c.drafter.kind, "dflash2");
  EXPECT_EQ(c.drafter.conv_kernel_size, 2);
  EXPECT_EQ(c.drafter.conv_group_size, 16);
  EXPECT_EQ(c.drafter.selector_rank, 256);
  EXPECT_EQ(c.drafter.selector_top_k, 16);
  EXPECT_DOUBLE_EQ(c.drafter.output_multiplier, 1.0);
  EXPECT_DOUBLE_EQ(c.drafter.final_logit_softcapping, 0.0);
  EXPECT_DOUBLE_EQ(c.train.dflash2_selector_loss_alpha, 1.0);
  EXPECT_DOUBLE_EQ(c.train.dflash2_selector_warmup_ratio, 0.0);
  EXPECT_DOUBLE_EQ(c.train.dflash2_selector_ramp_ratio, 0.0);
  EXPECT_FALSE(c.train.dflash2_selector_stop_gradient);

  c = config_parse(dflash2 +
                       "conv_kernel_size = 3\nconv_group_size = 8\nselector_rank = 7\nselector_top_k = 5\n"
                       "output_multiplier = 0.5\nfinal_logit_softcapping = 30.0\n[train]\n"
                       "dflash2_selector_loss_alpha = 0.25\ndflash2_selector_warmup_ratio = 0.1\n"
                       "dflash2_selector_ramp_ratio = 0.2\ndflash2_selector_stop_gradient = true\n",
                   "test.toml");
  EXPECT_EQ(c.drafter.conv_kernel_size, 3);
  EXPECT_EQ(c.drafter.conv_group_size, 8);
  EXPECT_EQ(c.drafter.selector_rank, 7);
  EXPECT_EQ(c.drafter.selector_top_k, 5);
  EXPECT_DOUBLE_EQ(c.drafter.output_multiplier, 0.5);
  EXPECT_DOUBLE_EQ(c.drafter.final_logit_softcapping, 30.0);
  EXPECT_DOUBLE_EQ(c.train.dflash2_selector_loss_alpha, 0.25);
  EXPECT_DOUBLE_EQ(c.train.dflash2_selector_warmup_ratio, 0.1);
  EXPECT_DOUBLE_EQ(c.train.dflash2_selector_ramp_ratio, 0.2);
  EXPECT_TRUE(c.train.dflash2_selector_stop_gradient);
  const std::string table = config_table(c);
  for (const char* shown :
       {"drafter.conv_group_size", "drafter.selector_top_k", "train.dflash2_selector_ramp_ratio"})
    EXPECT_NE(table.find(shown), std::string::npos) << shown << "\n" << table;

  const std::pair<const char*, const char*> bad[] = {
      {"conv_kernel_size = 0\n", "drafter.conv_kernel_size"},
      {"block_size = 4\nconv_kernel_size = 5\n", "drafter.conv_kernel_size"},
      {"conv_group_size = 0\n", "drafter.conv_group_size"},
      {"selector_rank = 0\n", "drafter.selector_rank"},
      {"selector_top_k = 0\n", "drafter.selector_top_k"},
      {"output_multiplier = 0.0\n", "drafter.output_multiplier"},
      {"final_logit_softcapping = -1.0\n", "drafter.final_logit_softcapping"},
      {"[train]\ndflash2_selector_loss_alpha = -0.5\n", "train.dflash2_selector_loss_alpha"},
      {"[train]\ndflash2_selector_warmup_ratio = 1.5\n", "train.dflash2_selector_warmup_ratio"},
      {"[train]\ndflash2_selector_ramp_ratio = -0.1\n", "train.dflash2_selector_ramp_ratio"},
      {"[train]\nloss = \"kl\"\n", "drafter.kind = \"dflash2\" trains with CE only"},
      {"[train]\nloss = \"dpace\"\n", "drafter.kind = \"dflash2\" trains with CE only"},
      {"[train]\nstreak = true\n", "train.streak"},
  };
  for (const auto& [extra, named] : bad) {
    const std::string e = error_of(dflash2 + extra);
    EXPECT_NE(e.find(named), std::string::npos) << extra << " -> " << e;
  }
}

TEST(Config, Dflash2KeysAreRefusedUnderAnotherKind) {
  for (const char* extra :
       {"conv_kernel_size = 2\n", "conv_group_size = 16\n", "selector_rank = 8\n", "selector_top_k = 4\n",
        "output_multiplier = 1.0\n", "final_logit_softcapping = 3.0\n"}) {
    const std::string key = std::string(extra).substr(0, std::string(extra).find(' '));
    for (const char* kind : {"", "kind = \"domino\"\n"}) {
      const std::string e = error_of(std::string(kMinimal) + kind + extra);
      EXPECT_NE(e.find("'drafter." + key + "' belongs to drafter.kind = \"dflash2\""), std::string::npos)
          << e;
    }
  }
  for (const char* key : {"dflash2_selector_loss_alpha = 1.0", "dflash2_selector_warmup_ratio = 0.1",
                          "dflash2_selector_ramp_ratio = 0.1", "dflash2_selector_stop_gradient = true"}) {
    const std::string e = error_of(std::string(kMinimal) + "[train]\n" + key + "\n");
    const std::string name = std::string(key).substr(0, std::string(key).find(' '));
    EXPECT_NE(
        e.find("'train." + name + "' belongs to drafter.kind = \"dflash2\", but drafter.kind is \"dflash\""),
        std::string::npos)
        << e;
  }
  bool shown = false;
  for (const auto& [k, v] : config_parse(kMinimal, "test.toml").values)
    shown |= k == "drafter.selector_rank" || k == "train.dflash2_selector_loss_alpha";
  EXPECT_FALSE(shown) << "a DFlash run's table lists no DFlash2 key";
}

TEST(Config, DSparkKeysTakeSpecForgesNamesAndRecipeDefaults) {
  // The defaults of SpecForge's published recipes (configs/qwen3-8b-dspark.json, schema.py).
  Config c = config_parse(std::string(kMinimal) + "kind = \"dspark\"\n", "test.toml");
  EXPECT_EQ(c.drafter.kind, "dspark");
  EXPECT_EQ(c.drafter.markov_rank, 256);
  EXPECT_EQ(c.drafter.markov_head_type, "vanilla");
  EXPECT_TRUE(c.drafter.enable_confidence_head);
  EXPECT_TRUE(c.drafter.confidence_head_with_markov);
  EXPECT_DOUBLE_EQ(c.drafter.confidence_head_alpha, 1.0);
  EXPECT_EQ(c.drafter.attention_mode, "gqa");
  EXPECT_DOUBLE_EQ(c.train.dspark_ce_loss_alpha, 0.1);
  EXPECT_DOUBLE_EQ(c.train.dspark_l1_loss_alpha, 0.9);
  EXPECT_DOUBLE_EQ(c.train.dspark_confidence_head_alpha, 1.0);

  c = config_parse(std::string(kMinimal) +
                       "kind = \"dspark\"\nmarkov_rank = 7\nmarkov_head_type = \"rnn\"\n"
                       "confidence_head_with_markov = false\n[train]\ndspark_ce_loss_alpha = 0.5\n"
                       "dspark_l1_loss_alpha = 0.25\ndspark_confidence_head_alpha = 2.0\n",
                   "test.toml");
  EXPECT_EQ(c.drafter.markov_rank, 7);
  EXPECT_EQ(c.drafter.markov_head_type, "rnn");
  EXPECT_FALSE(c.drafter.confidence_head_with_markov);
  EXPECT_DOUBLE_EQ(c.train.dspark_l1_loss_alpha, 0.25);
  const std::string table = config_table(c);
  for (const char* shown : {"\"dspark\"", "drafter.markov_head_type", "train.dspark_confidence_head_alpha"})
    EXPECT_NE(table.find(shown), std::string::npos) << shown << "\n" << table;

  // enable_confidence_head unset follows confidence_head_alpha > 0, as in SpecForge; set, it wins.
  const std::string dspark = std::string(kMinimal) + "kind = \"dspark\"\n";
  EXPECT_FALSE(
      config_parse(dspark + "confidence_head_alpha = 0.0\n", "t.toml").drafter.enable_confidence_head);
  EXPECT_TRUE(config_parse(dspark + "confidence_head_alpha = 0.0\nenable_confidence_head = true\n", "t.toml")
                  .drafter.enable_confidence_head);
  EXPECT_FALSE(
      config_parse(dspark + "enable_confidence_head = false\n", "t.toml").drafter.enable_confidence_head);

  // Its keys under another kind are refused naming them, and Domino's under dspark.
  for (const char* extra : {"markov_rank = 8\n", "markov_head_type = \"gated\"\n",
                            "enable_confidence_head = true\n", "confidence_head_with_markov = true\n",
                            "confidence_head_alpha = 1.0\n", "attention_mode = \"gqa\"\n"}) {
    const std::string key = std::string(extra).substr(0, std::string(extra).find(' '));
    for (const char* kind : {"", "kind = \"domino\"\n"}) {
      const std::string e = error_of(std::string(kMinimal) + kind + extra);
      EXPECT_NE(e.find("'drafter." + key + "' belongs to drafter.kind = \"dspark\""), std::string::npos) << e;
    }
  }
  EXPECT_NE(error_of(std::string(kMinimal) + "[train]\ndspark_l1_loss_alpha = 0.5\n")
                .find("'train.dspark_l1_loss_alpha' belongs to drafter.kind = \"dspark\""),
            std::string::npos);
  EXPECT_NE(
      error_of(dspark + "emb_dim = 64\n").find("'drafter.emb_dim' belongs to drafter.kind = \"domino\""),
      std::string::npos);
}

TEST(Config, DSparkRefusesWhatSpecForgeRefuses) {
  const std::string dspark = std::string(kMinimal) + "kind = \"dspark\"\n";
  for (const char* loss : {"kl", "dpace"}) {
    const std::string e = error_of(dspark + "[train]\nloss = \"" + loss + "\"\n");
    EXPECT_NE(
        e.find("'train.loss' = \"" + std::string(loss) + "\": drafter.kind = \"dspark\" trains its own loss"),
        std::string::npos)
        << e;
  }
  EXPECT_NE(error_of(dspark + "[train]\nstreak = true\n").find("'train.streak'"), std::string::npos);
  // train.gamma = 0 is SpecForge's unset loss_decay_gamma (no decay) for DSpark alone; below 0 never.
  EXPECT_DOUBLE_EQ(config_parse(dspark + "[train]\ngamma = 0.0\n", "t.toml").train.gamma, 0.0);
  EXPECT_NE(error_of(dspark + "[train]\ngamma = -1.0\n").find("'train.gamma'"), std::string::npos);
  EXPECT_NE(error_of(std::string(kMinimal) + "[train]\ngamma = 0.0\n").find("'train.gamma'"),
            std::string::npos);
  EXPECT_NE(error_of(dspark + "markov_head_type = \"lstm\"\n").find("'drafter.markov_head_type'"),
            std::string::npos);
  EXPECT_NE(error_of(dspark + "markov_rank = -1\n").find("'drafter.markov_rank'"), std::string::npos);
  // A Markov-fed confidence head needs a Markov head; without one the confidence head reads h alone.
  EXPECT_NE(error_of(dspark + "markov_rank = 0\n").find("'drafter.confidence_head_with_markov'"),
            std::string::npos);
  EXPECT_EQ(error_of(dspark + "markov_rank = 0\nconfidence_head_with_markov = false\n"), "");
  // gqa (the default) needs fewer KV heads than query heads; mha equal counts.
  EXPECT_NE(error_of(dspark + "heads = 8\nkv_heads = 8\n").find("'drafter.attention_mode' = \"gqa\" needs"),
            std::string::npos);
  EXPECT_EQ(error_of(dspark + "heads = 8\nkv_heads = 8\nattention_mode = \"mha\"\n"), "");
  EXPECT_NE(error_of(dspark + "attention_mode = \"mha\"\n").find("'drafter.attention_mode' = \"mha\" needs"),
            std::string::npos);
  EXPECT_NE(error_of(dspark + "attention_mode = \"mqa\"\n").find("'drafter.attention_mode'"),
            std::string::npos);
  EXPECT_NE(error_of(dspark + "confidence_head_alpha = -1.0\n").find("'drafter.confidence_head_alpha'"),
            std::string::npos);
  EXPECT_NE(error_of(dspark + "[train]\ndspark_ce_loss_alpha = -0.1\n").find("'train.dspark_ce_loss_alpha'"),
            std::string::npos);
}
