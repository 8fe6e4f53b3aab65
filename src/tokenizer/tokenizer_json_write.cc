// Hugging Face tokenizer.json writer for both tokenizer models; the `tokenizers` library loads the
// output and encodes as we do.
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file_io.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_impl.h"

namespace tessera::tokenizer {
namespace {

// JSON string literal for UTF-8 text (contents are valid UTF-8: checked on read and in training).
std::string quote(const std::string& s) {
  return nlohmann::json(s).dump();
}

constexpr const char* kByteLevel =
    "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": true, "
    "\"use_regex\": ";

constexpr const char* kNfc = "{\"type\": \"NFC\"}";

std::string byte_level_pre_tokenizer(PreTokenizer pre) {
  switch (pre) {
    case PreTokenizer::gpt2:
      return cat(kByteLevel, "true}");
    case PreTokenizer::smollm:
      return cat(
          "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Digits\", "
          "\"individual_digits\": true}, ",
          kByteLevel, "true}]}");
    case PreTokenizer::llama3:
    case PreTokenizer::qwen2:
    case PreTokenizer::qwen35:
      return cat(
          "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", "
          "\"pattern\": {\"Regex\": ",
          quote(std::string(pre_tokenizer_split_regex(pre))),
          "}, \"behavior\": \"Isolated\", \"invert\": false}, ", kByteLevel, "false}]}");
    case PreTokenizer::falcon:
    case PreTokenizer::deepseek_coder:
    case PreTokenizer::deepseek_llm:
      break;
  }
  fail("[tokenizer] to_json: writing pre-tokenizer '", pre_tokenizer_name(pre),
       "' to tokenizer.json is not supported (only gpt2, smollm, llama3, qwen2 and qwen35)");
}

// normalizer, pre_tokenizer and decoder of a SentencePiece-style tokenizer.
void spm_components(const TokenizerState& m, std::string* normalizer, std::string* pre,
                    std::string* decoder) {
  const std::string meta = quote(std::string(kMetaSpace));
  const std::string replace =
      cat("{\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, "
          "\"content\": ",
          meta, "}");
  const char* scheme = "never";
  if (m.space_prefix == SpacePrefix::every) {
    *normalizer =
        cat("{\"type\": \"Sequence\", \"normalizers\": [", m.nfc ? kNfc : "", m.nfc ? ", " : "",
            "{\"type\": \"Prepend\", \"prepend\": ", meta, "}, ", replace, "]}");
  } else {
    *normalizer = m.nfc ? kNfc : "null";
    scheme = m.space_prefix == SpacePrefix::first  ? "first"
             : m.space_prefix == SpacePrefix::none ? "never"
                                                   : "always";
  }
  if (m.space_prefix == SpacePrefix::every && !m.split_at_spaces)
    *pre = "null";
  else
    *pre = cat("{\"type\": \"Metaspace\", \"replacement\": ", meta, ", \"prepend_scheme\": \"",
               scheme, "\", \"split\": ", m.split_at_spaces ? "true" : "false", "}");
  *decoder =
      cat("{\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Replace\", \"pattern\": "
          "{\"String\": ",
          meta, "}, \"content\": \" \"}, {\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"}",
          m.space_prefix == SpacePrefix::none
              ? ""
              : ", {\"type\": \"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 0}",
          "]}");
}

// A TemplateProcessing that puts bos first (how tokenizer.json says "add bos"), or "null".
std::string bos_post_processor(const TokenizerState& m) {
  if (!m.special.add_bos || m.special.bos < 0) return "null";
  const std::string bos = quote(m.tokens[m.special.bos]);
  const std::string tok = cat("{\"SpecialToken\": {\"id\": ", bos, ", \"type_id\": 0}}");
  auto seq = [](const char* id) {
    return cat("{\"Sequence\": {\"id\": \"", id, "\", \"type_id\": 0}}");
  };
  return cat("{\"type\": \"TemplateProcessing\", \"single\": [", tok, ", ", seq("A"),
             "], \"pair\": [", tok, ", ", seq("A"), ", ", tok, ", ", seq("B"),
             "], \"special_tokens\": {", bos, ": {\"id\": ", bos, ", \"ids\": [", m.special.bos,
             "], \"tokens\": [", bos, "]}}}");
}

}  // namespace

std::string Tokenizer::to_json_text() const {
  const Impl& m = *impl_;
  const bool spm = m.model == TokenizerModel::sentencepiece_bpe;
  TS_CHECK(m.model != TokenizerModel::wordpiece,
           "[tokenizer] to_json: writing a WordPiece (GGUF \"bert\") tokenizer to tokenizer.json "
           "is not supported");
  TS_CHECK(!m.split_newline_runs,
           "[tokenizer] to_json: the newline-run split of a GGUF \"gemma4\" vocabulary has no "
           "tokenizer.json form here");
  // Written by hand rather than through a json object: nlohmann's object sorts keys, and the
  // vocabulary reads best in id order.
  std::string s = "{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n";
  s += "  \"added_tokens\": [";
  for (size_t k = 0; k < m.added.size(); ++k) {
    const AddedToken& a = m.added[k];
    s += cat(k ? ",\n" : "\n", "    {\"id\": ", a.id, ", \"content\": ", quote(a.content),
             ", \"single_word\": false, \"lstrip\": ", a.lstrip ? "true" : "false",
             ", \"rstrip\": ", a.rstrip ? "true" : "false",
             ", \"normalized\": ", a.normalized ? "true" : "false",
             ", \"special\": ", a.special ? "true" : "false", "}");
  }
  s += m.added.empty() ? "],\n" : "\n  ],\n";
  if (spm) {
    std::string normalizer, pre, decoder;
    spm_components(m, &normalizer, &pre, &decoder);
    s += cat("  \"normalizer\": ", normalizer, ",\n  \"pre_tokenizer\": ", pre, ",\n");
    s += cat("  \"post_processor\": ", bos_post_processor(m), ",\n");
    s += cat("  \"decoder\": ", decoder, ",\n");
  } else {
    s += cat("  \"normalizer\": ", m.nfc ? kNfc : "null", ",\n");
    s += cat("  \"pre_tokenizer\": ", byte_level_pre_tokenizer(m.pre), ",\n");
    if (m.special.add_bos && m.special.bos >= 0)
      s += cat("  \"post_processor\": ", bos_post_processor(m), ",\n");
    else  // the layout train_bpe's files have always had
      s += "  \"post_processor\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, "
           "\"trim_offsets\": false, \"use_regex\": true},\n";
    s += "  \"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, "
         "\"trim_offsets\": true, \"use_regex\": true},\n";
  }
  const std::string unk = m.special.unk >= 0 ? quote(m.tokens[m.special.unk]) : "null";
  s += cat("  \"model\": {\n    \"type\": \"BPE\",\n    \"dropout\": null,\n    \"unk_token\": ",
           spm ? unk : "null",
           ",\n    \"continuing_subword_prefix\": null,\n    \"end_of_word_suffix\": null,\n"
           "    \"fuse_unk\": false,\n    \"byte_fallback\": ",
           spm ? "true" : "false", ",\n");
  if (m.ignore_merges) s += "    \"ignore_merges\": true,\n";
  s += "    \"vocab\": {";
  std::vector<std::string> keys(m.tokens.size());
  for (size_t id = 0; id < m.tokens.size(); ++id) {
    keys[id] = m.vocab_string(static_cast<int32_t>(id));
    s += cat(id ? ",\n" : "\n", "      ", quote(keys[id]), ": ", id);
  }
  s += "\n    },\n    \"merges\": [";
  for (size_t r = 0; r < m.merges.size(); ++r) {
    const std::string& a = keys[m.merges[r].first];
    const std::string& b = keys[m.merges[r].second];
    // Pieces may hold spaces only in SentencePiece vocabularies: those use the pair form.
    s += cat(r ? ",\n" : "\n", "      ",
             spm ? cat("[", quote(a), ", ", quote(b), "]") : quote(a + " " + b));
  }
  s += m.merges.empty() ? "]\n  }\n}\n" : "\n    ]\n  }\n}\n";
  return s;
}

void Tokenizer::save_json(const std::string& path) const {
  write_file_atomic(path, to_json_text());
}

}  // namespace tessera::tokenizer
