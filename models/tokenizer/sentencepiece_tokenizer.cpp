// models/tokenizer/sentencepiece_tokenizer.cpp: SentencePiece tokenizer.model files through
// libsentencepiece (in libtessera_sentencepiece.so, opened on first use), with control pieces written
// in the text ("<s>") split out first as HF does.
#include <algorithm>
#include <memory>

#include "common/error.h"
#include "common/module.h"
#include "models/tokenizer/builders.h"
#include "models/tokenizer/sentencepiece_module.h"

namespace tessera::tok {
namespace {

using LoadModel = SentencePieceModel* (*)(const char*, std::string*);

LoadModel load_module() {
  static LoadModel load = [] {
    std::string errors;
    void* entry = open_module(kSentencePieceModuleName, kSentencePieceEntryPoint, &errors);
    TESSERA_CHECK(entry != nullptr, "tokenizer.model files are read by " << kSentencePieceModuleName
                                        << " (built with tessera, linked to Debian's libsentencepiece0), "
                                        << "which did not load. dlopen:" << errors);
    return reinterpret_cast<LoadModel>(entry);
  }();
  return load;
}

std::unique_ptr<SentencePieceModel> load_model(const std::string& path) {
  std::string error;
  std::unique_ptr<SentencePieceModel> model(load_module()(path.c_str(), &error));
  TESSERA_CHECK(model != nullptr, path << ": not a SentencePiece model: " << error);
  return model;
}

class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(const std::string& path, bool add_bos, bool add_eos) : model_(load_model(path)) {
    bos_ = add_bos ? model_->bos_id() : -1;
    eos_ = add_eos ? model_->eos_id() : -1;
    for (int id = 0; id < model_->piece_size(); ++id) {
      if (model_->is_control(id) && !model_->id_to_piece(id).empty()) controls_.push_back(id);
    }
    std::sort(controls_.begin(), controls_.end(), [this](int a, int b) {
      return model_->id_to_piece(a).size() > model_->id_to_piece(b).size();
    });
    const int byte_zero = model_->piece_to_id("<0x00>");
    lossless_ = byte_zero != model_->unk_id() && model_->is_byte(byte_zero);
  }

  Encoding encode(std::string_view text, bool add_special) const override {
    Encoding e;
    if (add_special && bos_ >= 0) e.ids.push_back(bos_);
    size_t start = 0;
    for (size_t pos = 0; pos < text.size();) {
      int hit = -1;
      for (const int id : controls_) {
        if (text.substr(pos).starts_with(model_->id_to_piece(id))) {
          hit = id;
          break;
        }
      }
      if (hit < 0) {
        ++pos;
        continue;
      }
      encode_plain(text.substr(start, pos - start), e.ids);
      e.ids.push_back(hit);
      pos += model_->id_to_piece(hit).size();
      start = pos;
    }
    encode_plain(text.substr(start), e.ids);
    if (add_special && eos_ >= 0) e.ids.push_back(eos_);
    for (const int32_t id : e.ids) e.tokens.push_back(model_->id_to_piece(id));
    return e;
  }

  std::string decode(const std::vector<int32_t>& ids, bool skip_special) const override {
    std::vector<int> kept;
    for (const int32_t id : ids) {
      if (id < 0 || id >= model_->piece_size()) continue;  // as PipelineTokenizer: decodes to nothing
      if (!(skip_special && model_->is_control(id))) kept.push_back(id);
    }
    std::string text;
    std::string error;
    TESSERA_CHECK(model_->decode(kept, &text, &error), "SentencePiece decode failed: " << error);
    return text;
  }

  int64_t vocab_size() const override { return model_->piece_size(); }
  std::string id_to_token(int32_t id) const override {
    TESSERA_CHECK(id >= 0 && id < model_->piece_size(), "token id " << id << " is outside the vocabulary");
    return model_->id_to_piece(id);
  }
  int32_t token_to_id(std::string_view token) const override {
    const int id = model_->piece_to_id(token);
    return id == model_->unk_id() && token != model_->id_to_piece(id) ? -1 : id;
  }
  bool lossless() const override { return lossless_; }
  bool is_special(int32_t id) const override {
    return id >= 0 && id < model_->piece_size() && model_->is_control(id);
  }

 private:
  void encode_plain(std::string_view text, std::vector<int32_t>& ids) const {
    if (text.empty()) return;
    std::vector<int> out;
    std::string error;
    TESSERA_CHECK(model_->encode(text, &out, &error), "SentencePiece encode failed: " << error);
    ids.insert(ids.end(), out.begin(), out.end());
  }

  std::unique_ptr<SentencePieceModel> model_;
  int bos_ = -1, eos_ = -1;
  std::vector<int> controls_;  // control pieces with text, longest first
  bool lossless_ = false;
};

}  // namespace

std::unique_ptr<Tokenizer> load_sentencepiece_model(const std::string& path, bool add_bos, bool add_eos) {
  return std::make_unique<SentencePieceTokenizer>(path, add_bos, add_eos);
}

}  // namespace tessera::tok
