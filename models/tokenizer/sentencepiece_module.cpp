// models/tokenizer/sentencepiece_module.cpp: libtessera_sentencepiece.so, SentencePieceModel over
// libsentencepiece's SentencePieceProcessor (sentencepiece_module.h says why it is a module).
#include "models/tokenizer/sentencepiece_module.h"

#include <sentencepiece_processor.h>

#include <exception>
#include <memory>

namespace tessera::tok {
namespace {

class ProcessorModel final : public SentencePieceModel {
 public:
  sentencepiece::util::Status load(const std::string& path) { return processor_.Load(path); }

  int piece_size() const override { return processor_.GetPieceSize(); }
  int bos_id() const override { return processor_.bos_id(); }
  int eos_id() const override { return processor_.eos_id(); }
  int unk_id() const override { return processor_.unk_id(); }
  bool is_control(int id) const override { return processor_.IsControl(id); }
  bool is_byte(int id) const override { return processor_.IsByte(id); }
  const std::string& id_to_piece(int id) const override { return processor_.IdToPiece(id); }
  int piece_to_id(std::string_view piece) const override { return processor_.PieceToId(piece); }

  bool encode(std::string_view text, std::vector<int>* ids, std::string* error) const override {
    return report(processor_.Encode(text, ids), error);
  }
  bool decode(const std::vector<int>& ids, std::string* text, std::string* error) const override {
    return report(processor_.Decode(ids, text), error);
  }

 private:
  static bool report(const sentencepiece::util::Status& status, std::string* error) {
    if (!status.ok()) *error = status.ToString();
    return status.ok();
  }

  sentencepiece::SentencePieceProcessor processor_;
};

}  // namespace
}  // namespace tessera::tok

extern "C" tessera::tok::SentencePieceModel* tessera_sentencepiece_load(const char* path, std::string* error) {
  try {
    auto model = std::make_unique<tessera::tok::ProcessorModel>();
    const auto status = model->load(path);
    if (!status.ok()) {
      *error = status.ToString();
      return nullptr;
    }
    return model.release();
  } catch (const std::exception& e) {
    *error = e.what();
    return nullptr;
  }
}
