//! SFT's chat templates and masks against transformers. `tests/data/chat/` holds four tokenizer
//! folders whose `tokenizer_config.json` carries a real model's chat template (Llama 3, Qwen3,
//! Gemma 3, Mixtral; each file's `source` names where it was copied from) over a small byte-level
//! BPE with the template's special tokens added. `golden.json` was written once by
//! `tools/data/chat_golden.py` with transformers 5.24.0 / Jinja2 3.1.6, never by maxrs: each
//! conversation's `apply_chat_template` text and ids, the generation prompt, and MaxText's SFT
//! segments (its `apply_chat_template` + `tokenization`, input_pipeline_utils.py at e591f30).

use std::path::{Path, PathBuf};

use maxrs::data::batch::Batch;
use maxrs::data::chat::{ChatTemplate, Message};
use maxrs::data::packing::{Encoded, Packer, Packing};
use maxrs::data::TextTokenizer;
use serde_json::Value;

pub(crate) fn chat_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/chat").join(name)
}

fn golden() -> serde_json::Map<String, Value> {
    let text = std::fs::read_to_string(chat_dir("golden.json")).unwrap();
    let all: Value = serde_json::from_str(&text).unwrap();
    all["cases"].as_object().unwrap().clone()
}

fn load(name: &str) -> (ChatTemplate, TextTokenizer) {
    let dir = chat_dir(name);
    let path = dir.to_str().unwrap();
    (ChatTemplate::load("", "", path).unwrap(), TextTokenizer::load(path, "huggingface", false, false).unwrap())
}

fn ids(v: &Value) -> Vec<i32> {
    serde_json::from_value(v.clone()).unwrap()
}

#[test]
fn rendered_text_and_ids_equal_transformers_for_llama3_qwen3_gemma3_mixtral() {
    let golden = golden();
    assert_eq!(golden.len(), 4);
    for (name, cases) in &golden {
        let (template, tokenizer) = load(name);
        for (i, case) in cases.as_array().unwrap().iter().enumerate() {
            let messages: Vec<Message> = serde_json::from_value(case["messages"].clone()).unwrap();
            let text = template.render(&messages, false).unwrap();
            assert_eq!(text, case["text"].as_str().unwrap(), "{name} case {i}: rendered text");
            assert_eq!(tokenizer.encode_text(&text).unwrap(), ids(&case["ids"]), "{name} case {i}: ids");
            let prompt = template.render(&messages[..messages.len() - 1], true).unwrap();
            assert_eq!(prompt, case["generation_prompt"].as_str().unwrap(), "{name} case {i}: generation prompt");
            let segments = template.segments(&tokenizer, &messages).unwrap();
            let want: Vec<(Vec<i32>, bool)> = case["sft"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| (ids(&s["ids"]), s["prompt"].as_bool().unwrap()))
                .collect();
            assert_eq!(segments, want, "{name} case {i}: MaxText's SFT segments");
        }
    }
}

/// The completion-only targets: the pad id on every prompt token, the ids on every completion
/// token; after packing and the shift exactly the completion tokens carry loss.
#[test]
fn completion_only_mask_survives_packing_and_the_shift() {
    let golden = golden();
    let (template, tokenizer) = load("qwen3");
    let pad = tokenizer.pad_id();
    let cases = golden["qwen3"].as_array().unwrap();
    let mut packer = Packer::new(256, 2, Packing::On { max_segments: None }, pad);
    let mut completion_tokens = 0;
    for case in cases {
        let messages: Vec<Message> = serde_json::from_value(case["messages"].clone()).unwrap();
        let (all, targets) = template.encode(&tokenizer, &messages, true, 256).unwrap();
        let mut want_targets = Vec::new();
        for s in case["sft"].as_array().unwrap() {
            let seg = ids(&s["ids"]);
            if s["prompt"].as_bool().unwrap() {
                want_targets.extend(std::iter::repeat_n(pad, seg.len()));
            } else {
                completion_tokens += seg.len();
                want_targets.extend(seg);
            }
        }
        assert_eq!(targets, want_targets);
        let (plain, same) = template.encode(&tokenizer, &messages, false, 256).unwrap();
        assert_eq!((plain.clone(), same), (all.clone(), plain), "without completion_only the targets are the ids");
        assert!(
            packer.add(&Encoded { ids: all, targets: Some(targets), pair: None }),
            "4 short conversations fit 2 rows"
        );
    }
    let batch = Batch::from_documents(&packer.finish(), 256, pad, tokenizer.bos_id());
    // Every completion token is the target of the token before it; no prompt token is.
    assert_eq!(batch.total_weights() as usize, completion_tokens);
    let (targets, weights) = (batch.targets.to_i64(), batch.targets_segmentation.to_i64());
    for (t, w) in targets.iter().zip(&weights) {
        if *w != 0 {
            assert_ne!(*t, pad as i64);
        }
    }
}

#[test]
fn conversations_from_columns_follow_maxtext() {
    use maxrs::data::chat::conversation;
    let row = |json: &str| serde_json::from_str::<serde_json::Map<String, Value>>(json).unwrap();
    let cols = |c: &[&str]| c.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let m = |role: &str, content: &str| Message { role: role.into(), content: content.into() };
    // prompt/completion lists interleave turn by turn (MaxText's combine_columns).
    let r = row(r#"{"prompt": [{"role": "user", "content": "a"}, {"role": "user", "content": "c"}],
                    "completion": [{"role": "assistant", "content": "b"}, {"role": "assistant", "content": "d"}]}"#);
    let got = conversation(&r, &cols(&["prompt", "completion"])).unwrap();
    assert_eq!(got, [m("user", "a"), m("assistant", "b"), m("user", "c"), m("assistant", "d")]);
    // Strings: one user and one assistant message, whatever the order the columns are named in.
    let r = row(r#"{"question": "q", "answer": "a"}"#);
    assert_eq!(conversation(&r, &cols(&["answer", "question"])).unwrap(), [m("user", "q"), m("assistant", "a")]);
    // A bad row is a reason, not a panic.
    let r = row(r#"{"messages": [{"role": "user"}]}"#);
    let why = conversation(&r, &cols(&["messages"])).unwrap_err();
    assert!(why.contains("`messages` is not a list of {role, content} messages"), "{why}");
}

#[test]
fn template_errors_name_the_cause() {
    let (template, tokenizer) = load("mistral");
    let m = |role: &str| Message { role: role.into(), content: "x".into() };
    let why = template.segments(&tokenizer, &[m("user"), m("user")]).unwrap_err();
    assert!(why.contains("Conversation roles must alternate"), "{why}");
    let why = template.segments(&tokenizer, &[m("user"), m("system")]).unwrap_err();
    assert!(why.contains("message 1 is a system message"), "{why}");
    let bad = ChatTemplate::new("{% for %}".into(), vec![]).unwrap_err().to_string();
    assert!(bad.contains("not valid Jinja"), "{bad}");
}

const WORDS: &[&str] =
    &["love", "king", "night", "sweet", "lord", "fair", "heart", "death", "sir", "good", "time", "eyes"];

/// `n` conversations "Repeat: a b c" -> "a b c" (words picked by a fixed LCG from `seed`), as
/// JSON Lines of `{"messages": [...]}`.
pub(crate) fn repeat_conversations(n: usize, seed: u64) -> (String, Vec<(String, String)>) {
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let mut pick = || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        WORDS[(state >> 33) as usize % WORDS.len()]
    };
    let mut lines = String::new();
    let mut pairs = Vec::new();
    for _ in 0..n {
        let answer = format!("{} {} {}", pick(), pick(), pick());
        let question = format!("Repeat: {answer}");
        let messages = serde_json::json!({"messages": [
            {"role": "user", "content": question}, {"role": "assistant", "content": answer}]});
        lines.push_str(&format!("{messages}\n"));
        pairs.push((question, answer));
    }
    (lines, pairs)
}

/// The default model narrowed to width 64 (half the CPU of the default's 256, whose steps were
/// most of this test's time) on 200 conversations with Llama 3's template and completion-only loss:
/// each step's `total_weights` is exactly its conversations' completion tokens (the answer and
/// `<|eot_id|>`, counted from the template's format, not from maxrs's SFT code), the loss falls,
/// and eval on a held-out file falls too.
#[test]
fn sft_run_trains_on_completions_only() {
    use maxrs::cluster::client_for;
    use maxrs::config;
    use maxrs::train::run::train;
    let dir = tempfile::tempdir().unwrap();
    let (train_lines, pairs) = repeat_conversations(200, 1);
    let (eval_lines, _) = repeat_conversations(40, 2);
    std::fs::write(dir.path().join("train.jsonl"), train_lines).unwrap();
    std::fs::write(dir.path().join("eval.jsonl"), eval_lines).unwrap();
    let metrics = dir.path().join("metrics.jsonl");
    let tokenizer_dir = chat_dir("llama3");
    let args: Vec<String> = vec![
        "dataset_type=hf".into(),
        "use_sft=true".into(),
        "sft_train_on_completion_only=true".into(),
        "train_data_columns=[messages]".into(),
        "eval_data_columns=[messages]".into(),
        format!("hf_train_files={}", dir.path().join("train.jsonl").display()),
        format!("hf_eval_files={}", dir.path().join("eval.jsonl").display()),
        format!("tokenizer_path={}", tokenizer_dir.display()),
        "tokenizer_type=huggingface".into(),
        "vocab_size=1024".into(),
        "packing=false".into(),
        "enable_data_shuffling=false".into(),
        "max_target_length=64".into(),
        "base_emb_dim=64".into(),
        "base_mlp_dim=128".into(),
        "head_dim=16".into(),
        "learning_rate=3e-3".into(),
        "steps=30".into(),
        "eval_interval=29".into(),
        "eval_steps=2".into(),
        format!("metrics_file={}", metrics.display()),
    ];
    let c = config::load(None, &args).unwrap();
    let client = client_for(&c).unwrap();
    let report = train(&c, &client).unwrap();

    let tokenizer = TextTokenizer::load(tokenizer_dir.to_str().unwrap(), "huggingface", false, false).unwrap();
    let completion = |answer: &str| tokenizer.encode_text(answer).unwrap().len() as f64 + 1.0;
    let lines: Vec<Value> =
        std::fs::read_to_string(&metrics).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let steps: Vec<&Value> = lines.iter().filter(|l| l.get("learning/total_weights").is_some()).collect();
    assert_eq!(steps.len(), 30);
    for (k, line) in steps.iter().enumerate().take(25) {
        // 8 conversations per step, in file order; 200 = 25 steps per epoch.
        let want: f64 = pairs[8 * k..8 * k + 8].iter().map(|(_, a)| completion(a)).sum();
        assert_eq!(line["learning/total_weights"].as_f64().unwrap(), want, "step {k}: only completions carry loss");
    }
    let mean = |xs: &[f64]| xs.iter().sum::<f64>() / xs.len() as f64;
    let (first, last) = (mean(&report.losses[..5]), mean(&report.losses[25..]));
    // 30 steps (50 until CI time mattered): 6.99 -> 2.11; held out 7.46 -> 2.16 (the default
    // width, 256, at learning rate 1e-3: 6.33 -> 1.27 and 7.44 -> 1.36).
    assert!(last < first - 2.0, "completion loss {first:.3} -> {last:.3}");
    let evals: Vec<f64> = report.evals.iter().map(|e| e.avg_loss()).collect();
    assert_eq!(evals.len(), 2, "evals after steps 0 and 29");
    assert!(evals[1] < evals[0] - 2.0, "held-out completion loss falls: {evals:?}");
}
