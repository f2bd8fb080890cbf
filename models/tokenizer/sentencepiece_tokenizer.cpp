// models/tokenizer/sentencepiece_tokenizer.cpp: SentencePiece tokenizer.model files through
// libsentencepiece, with control pieces written in the text ("<s>") split out first as HF does.
#include <sentencepiece_processor.h>

#include <algorithm>

#include "common/error.h"
#include "models/tokenizer/builders.h"

namespace tessera::tok {
namespace {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(const std::string& path, bool add_bos, bool add_eos) {
    const auto status = processor_.Load(path);
    TESSERA_CHECK(status.ok(), path << ": not a SentencePiece model: " << status.ToString());
    bos_ = add_bos ? processor_.bos_id() : -1;
    eos_ = add_eos ? processor_.eos_id() : -1;
    for (int id = 0; id < processor_.GetPieceSize(); ++id) {
      if (processor_.IsControl(id) && !processor_.IdToPiece(id).empty()) controls_.push_back(id);
    }
    std::sort(controls_.begin(), controls_.end(), [this](int a, int b) {
      return processor_.IdToPiece(a).size() > processor_.IdToPiece(b).size();
    });
    lossless_ = processor_.PieceToId("<0x00>") != processor_.unk_id() && processor_.IsByte(processor_.PieceToId("<0x00>"));
  }

  Encoding encode(std::string_view text, bool add_special) const override {
    Encoding e;
    if (add_special && bos_ >= 0) e.ids.push_back(bos_);
    size_t start = 0;
    for (size_t pos = 0; pos < text.size();) {
      int hit = -1;
      for (const int id : controls_) {
        if (text.substr(pos).starts_with(processor_.IdToPiece(id))) {
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
      pos += processor_.IdToPiece(hit).size();
      start = pos;
    }
    encode_plain(text.substr(start), e.ids);
    if (add_special && eos_ >= 0) e.ids.push_back(eos_);
    for (const int32_t id : e.ids) e.tokens.push_back(processor_.IdToPiece(id));
    return e;
  }

  std::string decode(const std::vector<int32_t>& ids, bool skip_special) const override {
    std::vector<int> kept;
    for (const int32_t id : ids) {
      if (id < 0 || id >= processor_.GetPieceSize()) continue;  // as PipelineTokenizer: decodes to nothing
      if (!(skip_special && processor_.IsControl(id))) kept.push_back(id);
    }
    std::string text;
    const auto status = processor_.Decode(kept, &text);
    TESSERA_CHECK(status.ok(), "SentencePiece decode failed: " << status.ToString());
    return text;
  }

  int64_t vocab_size() const override { return processor_.GetPieceSize(); }
  std::string id_to_token(int32_t id) const override {
    TESSERA_CHECK(id >= 0 && id < processor_.GetPieceSize(), "token id " << id << " is outside the vocabulary");
    return processor_.IdToPiece(id);
  }
  int32_t token_to_id(std::string_view token) const override {
    const int id = processor_.PieceToId(token);
    return id == processor_.unk_id() && token != processor_.IdToPiece(id) ? -1 : id;
  }
  bool lossless() const override { return lossless_; }
  bool is_special(int32_t id) const override {
    return id >= 0 && id < processor_.GetPieceSize() && processor_.IsControl(id);
  }

 private:
  void encode_plain(std::string_view text, std::vector<int32_t>& ids) const {
    if (text.empty()) return;
    std::vector<int> out;
    const auto status = processor_.Encode(text, &out);
    TESSERA_CHECK(status.ok(), "SentencePiece encode failed: " << status.ToString());
    ids.insert(ids.end(), out.begin(), out.end());
  }

  sentencepiece::SentencePieceProcessor processor_;
  int bos_ = -1, eos_ = -1;
  std::vector<int> controls_;  // control pieces with text, longest first
  bool lossless_ = false;
};

}  // namespace

std::unique_ptr<Tokenizer> load_sentencepiece_model(const std::string& path, bool add_bos, bool add_eos) {
  return std::make_unique<SentencePieceTokenizer>(path, add_bos, add_eos);
}

}  // namespace tessera::tok
