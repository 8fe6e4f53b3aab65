// Chat conversations into masked token shards: the model's template renders each growing prefix
// of a conversation, the differences between renders are the turns, and the assistant's turns
// are the tokens the loss counts.
#include "train/chat_data.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/file_io.h"
#include "jinja/template.h"

namespace tessera::train {

namespace {

std::string render(const ChatTemplate& t, const nlohmann::ordered_json& messages, size_t n,
                   bool generation_prompt) {
  nlohmann::ordered_json prefix = nlohmann::ordered_json::array();
  for (size_t i = 0; i < n; ++i) prefix.push_back(messages[i]);
  return jinja::render_chat_template(t.source, prefix, t.bos, t.eos, generation_prompt, nullptr,
                                     jinja::local_now, t.name);
}

void append(ChatTokens& out, const tokenizer::Tokenizer& tok, const std::string& text, int mask) {
  if (text.empty()) return;
  const std::vector<int32_t> ids = tok.encode(text);
  out.tokens.insert(out.tokens.end(), ids.begin(), ids.end());
  out.mask.insert(out.mask.end(), ids.size(), mask);
}

// Checks one line's conversation: messages with string role and content, an assistant among
// them. Returns the messages as the template takes them (role and content only).
nlohmann::ordered_json conversation(const std::string& line, const std::string& where) {
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(line);
  } catch (const std::exception&) {
    fail("[prepare] ", where, ": not valid JSON");
  }
  TS_CHECK(
      j.is_object() && j.contains("messages") && j["messages"].is_array() && !j["messages"].empty(),
      "[prepare] ", where,
      ": not a conversation (expected {\"messages\": [{\"role\": ..., \"content\": ...}]})");
  nlohmann::ordered_json msgs = nlohmann::ordered_json::array();
  bool assistant = false;
  for (size_t i = 0; i < j["messages"].size(); ++i) {
    const auto& m = j["messages"][i];
    TS_CHECK(m.is_object() && m.contains("role") && m["role"].is_string() &&
                 m.contains("content") && m["content"].is_string(),
             "[prepare] ", where, ": message ", i, " needs a string 'role' and 'content'");
    const std::string role = m["role"].get<std::string>();
    TS_CHECK(role == "system" || role == "user" || role == "assistant", "[prepare] ", where,
             ": message ", i, " has role '", role, "' (system, user or assistant)");
    assistant = assistant || role == "assistant";
    msgs.push_back({{"role", role}, {"content", m["content"]}});
  }
  TS_CHECK(assistant, "[prepare] ", where, ": no assistant message (nothing to learn)");
  return msgs;
}

}  // namespace

ChatTokens tokenize_chat(const tokenizer::Tokenizer& tok, const ChatTemplate& tmpl,
                         const nlohmann::ordered_json& messages, const std::string& where) {
  ChatTokens out;
  std::string done;  // the text tokenized so far
  auto take = [&](const std::string& text, int mask, size_t at) {
    TS_CHECK(text.starts_with(done), "[prepare] ", where, ": ", tmpl.name,
             " does not render the conversation up to message ", at,
             " as the start of the longer one, so the assistant's tokens cannot be told apart");
    append(out, tok, text.substr(done.size()), mask);
    done = text;
  };
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i]["role"] != "assistant") continue;
    take(render(tmpl, messages, i, true), 0, i);       // up to the assistant's header
    take(render(tmpl, messages, i + 1, false), 1, i);  // its turn
  }
  take(render(tmpl, messages, messages.size(), false), 0, messages.size());
  return out;
}

PrepareStats prepare_chat_data(const PrepareChatOptions& opt, const tokenizer::Tokenizer& tok,
                               const ChatTemplate& tmpl) {
  TS_CHECK(opt.val_fraction > 0 && opt.val_fraction < 1,
           "[prepare] val_fraction must be in (0, 1), got ", opt.val_fraction);
  TS_CHECK(!opt.out_dir.empty(), "[prepare] out_dir must name a folder");
  std::ifstream in(opt.input_path);
  TS_CHECK(in, "[prepare] ", opt.input_path, ": cannot read");
  std::vector<ChatTokens> convs;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = cat(opt.input_path, ":", n);
    convs.push_back(tokenize_chat(tok, tmpl, conversation(line, where), where));
  }
  TS_CHECK(convs.size() >= 2, "[prepare] ", opt.input_path, ": ", convs.size(),
           " conversations; training and validation need at least one each");
  const auto n_val = static_cast<size_t>(
      std::max(1.0, std::ceil(opt.val_fraction * static_cast<double>(convs.size()))));
  TS_CHECK(n_val < convs.size(), "[prepare] ", opt.input_path,
           ": val_fraction leaves no conversation for training");
  const tokenizer::SpecialTokens& sp = tok.special_tokens();
  const int32_t pad = sp.pad >= 0 ? sp.pad : sp.eos >= 0 ? sp.eos : 0;
  std::vector<int32_t> tokens, mask;
  int64_t n_train = 0;
  for (size_t c = 0; c < convs.size(); ++c) {
    if (c == convs.size() - n_val) n_train = static_cast<int64_t>(tokens.size());
    tokens.insert(tokens.end(), convs[c].tokens.begin(), convs[c].tokens.end());
    mask.insert(mask.end(), convs[c].mask.begin(), convs[c].mask.end());
    // To the next window's start. A window's targets reach one token into the next conversation,
    // whose first token (template text) is masked.
    while (opt.pad_to > 0 && tokens.size() % static_cast<size_t>(opt.pad_to) != 0) {
      tokens.push_back(pad);
      mask.push_back(0);
    }
  }
  const auto n = static_cast<int64_t>(tokens.size());
  TS_CHECK(n_train >= opt.min_tokens && n - n_train >= opt.min_tokens, "[prepare] ", opt.input_path,
           ": ", n_train, " train and ", n - n_train,
           " validation tokens; each split needs at least ", opt.min_tokens,
           " (one sequence plus its target): use more conversations or another val_fraction");
  PrepareStats st =
      write_splits(opt.out_dir, tokens, n_train, tok.vocab_size(), &mask, opt.tokenizer_json);
  st.documents = static_cast<int64_t>(convs.size());
  // The template travels with the data, so the model a run saves renders chats as it learned.
  write_file_atomic((std::filesystem::path(opt.out_dir) / "chat_template.jinja").string(),
                    tmpl.source);
  int64_t counted = 0;
  for (int32_t m : mask) counted += m;
  const std::string packing =
      opt.pad_to > 0 ? cat("each conversation padded to a multiple of ", opt.pad_to, " tokens")
                     : "conversations back to back";
  nlohmann::json meta = {{"format", "tessera-tokens"},       {"version", kShardVersion},
                         {"source", opt.input_path},         {"chat_template", tmpl.name},
                         {"conversations", st.documents},    {"vocab_size", st.vocab},
                         {"loss_tokens", counted},           {"packing", packing},
                         {"val_fraction", opt.val_fraction}, {"train_tokens", st.train_tokens},
                         {"val_tokens", st.val_tokens},      {"train_shards", st.train_shards},
                         {"val_shards", st.val_shards}};
  write_file_atomic((std::filesystem::path(opt.out_dir) / "meta.json").string(),
                    meta.dump(2) + "\n");
  return st;
}

}  // namespace tessera::train
