#!/usr/bin/env bash
# `dflash_mpi data convert|synth|info` from the command line: success paths, and that every bad input
# fails with a non-zero exit and a message naming the file and line. Args: binary, source dir.
set -u
BIN="$1"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
FAILS=0

fail() { echo "FAIL: $*"; FAILS=$((FAILS + 1)); }

# expect_ok DESC CMD...: exit 0.
expect_ok() {
  local desc="$1"; shift
  if ! "$@" >"$TMP/out" 2>&1; then fail "$desc: exit $? ($(cat "$TMP/out"))"; fi
}
# expect_err DESC TEXT CMD...: non-zero exit and TEXT in the output.
expect_err() {
  local desc="$1" text="$2"; shift 2
  if "$@" >"$TMP/out" 2>&1; then fail "$desc: succeeded but should fail"; return; fi
  grep -qF -- "$text" "$TMP/out" || fail "$desc: output lacks '$text': $(cat "$TMP/out")"
}
expect_out() {
  grep -qF -- "$1" "$TMP/out" || fail "output lacks '$1': $(cat "$TMP/out")"
}

# synth, then info reads it back.
expect_ok "synth" "$BIN" data synth --out "$TMP/s.h5" --vocab 97 --sequences 19 --min-len 3 --max-len 65 --seed 4
expect_out "19 sequences"
expect_ok "info" "$BIN" data info "$TMP/s.h5"
expect_out "19 sequences"
expect_out "vocab_size 97"
expect_out "length histogram"
expect_out "[      8,      16)"
expect_out "vocabulary use:"
expect_out "of 97), largest id"
expect_err "synth min>max" "--min-len 9 / --max-len 3" \
  "$BIN" data synth --out "$TMP/t.h5" --vocab 97 --sequences 3 --min-len 9 --max-len 3
[ -e "$TMP/t.h5" ] && fail "a failed synth left $TMP/t.h5"

# convert: good file.
printf '{"input_ids": [1, 2, 3]}\n{"input_ids": [4, 5], "loss_mask": [0, 1]}\n' >"$TMP/good.jsonl"
expect_ok "convert" "$BIN" data convert --in "$TMP/good.jsonl" --out "$TMP/good.h5" --vocab 10
expect_out "2 sequences, 5 tokens"
expect_out "80.0% of tokens in the loss"
expect_out "1 of 2 records have no loss_mask: written as loss_mask 1"
expect_ok "info on mixed" "$BIN" data info "$TMP/good.h5"
expect_out "layout: mixed: 1 sequences have a prompt followed by a response"
# convert of prompts (no record has a loss_mask): no mask is written, and the summary and info say what that means.
printf '{"input_ids": [1, 2, 3]}\n{"input_ids": [4, 5]}\n' >"$TMP/prompts.jsonl"
expect_ok "convert prompts" "$BIN" data convert --in "$TMP/prompts.jsonl" --out "$TMP/prompts.h5" --vocab 10
expect_out "no loss_mask (training: every token in the loss)"
expect_out "no record has a loss_mask, so none is written: training puts every token in the loss, eval takes each"
h5dump -H "$TMP/prompts.h5" 2>/dev/null | grep -q loss_mask && fail "convert of prompts wrote a loss_mask"
expect_ok "info on prompts" "$BIN" data info "$TMP/prompts.h5"
expect_out "layout: looks like prompts: no sequence has a loss_mask 0->1 step (the file has no loss_mask), so eval"
expect_out "(2.5 tokens on average)"
# The synthetic corpus: a prompt (loss_mask 0) then the trained part in every sequence.
expect_ok "info on synth" "$BIN" data info "$TMP/s.h5"
expect_out "layout: looks like training data: every sequence has a prompt (loss_mask 0) followed by a response"

# convert: each bad input names its line; no output file appears.
printf '{"input_ids": [1]}\n{"input_ids": [1]}\n{"input_ids": [4, 10]}\n' >"$TMP/range.jsonl"
expect_err "id out of range" "range.jsonl line 3: input_ids[1] = 10 is outside the vocabulary [0, 10)" \
  "$BIN" data convert --in "$TMP/range.jsonl" --out "$TMP/bad.h5" --vocab 10
printf '{"input_ids": [1]}\n{"input_ids": [1, \n' >"$TMP/json.jsonl"
expect_err "bad JSON" "json.jsonl line 2: not valid JSON" \
  "$BIN" data convert --in "$TMP/json.jsonl" --out "$TMP/bad.h5" --vocab 10
printf '{"input_ids": [1]}\n\n{"input_ids": [1]}\n' >"$TMP/blank.jsonl"
expect_err "empty line" "blank.jsonl line 2: empty line" \
  "$BIN" data convert --in "$TMP/blank.jsonl" --out "$TMP/bad.h5" --vocab 10
printf '{"input_ids": [1, 2], "loss_mask": [1]}\n' >"$TMP/mask.jsonl"
expect_err "mask length" "mask.jsonl line 1: 'loss_mask' has 1 entries" \
  "$BIN" data convert --in "$TMP/mask.jsonl" --out "$TMP/bad.h5" --vocab 10
printf '{"input_ids": []}\n' >"$TMP/empty.jsonl"
expect_err "empty input_ids" "empty.jsonl line 1: 'input_ids' is empty" \
  "$BIN" data convert --in "$TMP/empty.jsonl" --out "$TMP/bad.h5" --vocab 10
expect_err "missing input" "nope.jsonl: cannot open" \
  "$BIN" data convert --in "$TMP/nope.jsonl" --out "$TMP/bad.h5" --vocab 10
expect_err "missing --vocab" "--vocab" "$BIN" data convert --in "$TMP/good.jsonl" --out "$TMP/bad.h5"
expect_err "unwritable output" "$TMP/no_dir/x.h5" \
  "$BIN" data convert --in "$TMP/good.jsonl" --out "$TMP/no_dir/x.h5" --vocab 10
[ -e "$TMP/bad.h5" ] && fail "a failed convert left $TMP/bad.h5"
ls "$TMP" | grep -q '\.tmp\.' && fail "a temporary file was left behind"

# info on a file that is not a token file.
expect_err "info on JSONL" "cannot open as HDF5" "$BIN" data info "$TMP/good.jsonl"

# tokenize: conversations through the golden tokenizer (Hugging Face-trained) and the Qwen3 chat template
# (tests/golden/chat/templates), assistant-only loss.
TOK="$2/tests/golden/tokenizer"
QWEN3="$2/tests/golden/chat/templates/qwen3.jinja"
QWEN35="$2/tests/golden/chat/templates/qwen3.5.jinja"
QWEN36="$2/tests/golden/chat/templates/qwen3.6.jinja"
if "$BIN" data tokenize --help >/dev/null 2>&1 && ! "$BIN" data tokenize --tokenizer "$TOK" --in /dev/null \
     --out "$TMP/probe.h5" 2>&1 | grep -q "built without"; then
  cat > "$TMP/chats.jsonl" <<'JSON'
{"messages": [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4", "reasoning_content": "Simple."}]}
{"conversations": [{"from": "human", "value": "你好"}, {"from": "gpt", "value": "你好！😀"}]}
{"text": "plain text, trained whole"}
JSON
  # The golden tokenizer ships no template: `auto` says so and names the way out.
  expect_err "tokenize without a template" "ships no chat template" \
    "$BIN" data tokenize --tokenizer "$TOK" --in "$TMP/chats.jsonl" --out "$TMP/chats.h5"
  [ -e "$TMP/chats.h5" ] && fail "a failed tokenize left $TMP/chats.h5"
  expect_ok "tokenize" "$BIN" data tokenize --tokenizer "$TOK" --in "$TMP/chats.jsonl" --out "$TMP/chats.h5" \
    --chat-template "$QWEN3" --enable-thinking false
  expect_out "3 sequences"
  expect_out "chat template: $QWEN3"
  expect_ok "info on tokenized" "$BIN" data info "$TMP/chats.h5"
  expect_out "vocab_size 906"
  expect_out "layout: mixed: 2 sequences have a prompt followed by a response (a loss_mask 0->1 step)"
  # A model directory that ships its template as chat_template.jinja: found by `auto`.
  mkdir -p "$TMP/model"
  cp "$TOK/tokenizer.json" "$TMP/model/" && cp "$QWEN35" "$TMP/model/chat_template.jinja"
  echo '[{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]' > "$TMP/tools.json"
  expect_ok "tokenize auto, tools" "$BIN" data tokenize --tokenizer "$TMP/model" --in "$TMP/chats.jsonl" \
    --out "$TMP/auto.h5" --tools "$TMP/tools.json"
  expect_out "chat template: $TMP/model/chat_template.jinja"
  # Prompt files: the generation prompt ends each record and no loss_mask is written.
  printf '%s\n' '{"messages": [{"role": "user", "content": "Hi"}]}' > "$TMP/chatprompts.jsonl"
  expect_ok "tokenize prompts" "$BIN" data tokenize --tokenizer "$TMP/model" --in "$TMP/chatprompts.jsonl" \
    --out "$TMP/chatprompts.h5" --add-generation-prompt --enable-thinking true
  expect_out "no loss_mask"
  # Qwen3.6's preserve_thinking keeps the think block of a turn before the last user message: more tokens.
  printf '%s\n' '{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello", "reasoning_content": "Greet back."}, {"role": "user", "content": "Bye"}, {"role": "assistant", "content": "Bye"}]}' > "$TMP/twoturns.jsonl"
  expect_ok "tokenize qwen3.6" "$BIN" data tokenize --tokenizer "$TOK" --in "$TMP/twoturns.jsonl" \
    --out "$TMP/drop.h5" --chat-template "$QWEN36"
  expect_ok "tokenize qwen3.6 preserve_thinking" "$BIN" data tokenize --tokenizer "$TOK" --in "$TMP/twoturns.jsonl" \
    --out "$TMP/keep.h5" --chat-template "$QWEN36" --template-var preserve_thinking=true
  drop=$("$BIN" data info "$TMP/drop.h5" 2>&1 | grep -o '[0-9]* tokens' | head -1)
  keep=$("$BIN" data info "$TMP/keep.h5" 2>&1 | grep -o '[0-9]* tokens' | head -1)
  [ -n "$drop" ] && [ "${keep% tokens}" -gt "${drop% tokens}" ] ||
    fail "preserve_thinking=true gave $keep, not more than the $drop without it"
  expect_err "tokenize unread template var" "$QWEN36 never reads 'preserve_thinkin'" \
    "$BIN" data tokenize --tokenizer "$TOK" --in "$TMP/twoturns.jsonl" --out "$TMP/x.h5" --chat-template "$QWEN36" \
    --template-var preserve_thinkin=true
  expect_err "tokenize template var with its own option" "enable_thinking has its own option" \
    "$BIN" data tokenize --tokenizer "$TOK" --in "$TMP/twoturns.jsonl" --out "$TMP/x.h5" --chat-template "$QWEN36" \
    --template-var enable_thinking=false
  expect_ok "tokenize none" "$BIN" data tokenize --tokenizer "$TOK" --in "$TMP/chats.jsonl" --out "$TMP/none.h5" \
    --chat-template none
  printf '%s\n' '{"text": "ok"}' '{"messages": [{"role": "user"}]}' > "$TMP/badchat.jsonl"
  expect_err "tokenize bad line" "badchat.jsonl line 2: messages[0]: needs 'content'" \
    "$BIN" data tokenize --tokenizer "$TOK" --in "$TMP/badchat.jsonl" --out "$TMP/badchat.h5" --chat-template "$QWEN3"
  [ -e "$TMP/badchat.h5" ] && fail "a failed tokenize left $TMP/badchat.h5"
  # The template refuses a conversation: the record, the template line and its own message.
  printf '%s\n' '{"messages": [{"role": "assistant", "content": "no user"}]}' > "$TMP/nouser.jsonl"
  expect_err "tokenize template raises" "nouser.jsonl line 1: $TMP/model/chat_template.jinja line 79: " \
    "$BIN" data tokenize --tokenizer "$TMP/model" --in "$TMP/nouser.jsonl" --out "$TMP/nouser.h5"
  expect_out "No user query found in messages."
  [ -e "$TMP/nouser.h5" ] && fail "a failed tokenize left $TMP/nouser.h5"
  printf 'ok\n{%% include "x.jinja" %%}\n' > "$TMP/bad.jinja"
  expect_err "tokenize unsupported template" "bad.jinja line 2: the '{% include %}' tag is not supported" \
    "$BIN" data tokenize --tokenizer "$TOK" --in "$TMP/chats.jsonl" --out "$TMP/x.h5" --chat-template "$TMP/bad.jinja"
  expect_err "tokenize missing template" "cannot open the chat template" \
    "$BIN" data tokenize --tokenizer "$TOK" --in "$TMP/chats.jsonl" --out "$TMP/x.h5" --chat-template llama
  expect_err "tokenize no tokenizer" "cannot open" \
    "$BIN" data tokenize --tokenizer "$TMP/none" --in "$TMP/chats.jsonl" --out "$TMP/x.h5"
  [ -e "$TMP/x.h5" ] && fail "a failed tokenize left $TMP/x.h5"
else
  echo "note: this build has no tokenizer (PCRE2/libunistring missing); data tokenize checks skipped"
fi

if [ "$FAILS" -ne 0 ]; then echo "$FAILS check(s) failed"; exit 1; fi
echo "all data CLI checks passed"
