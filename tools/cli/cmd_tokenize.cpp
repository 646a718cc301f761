// deepinfer tokenize: text -> token ids (and back) with a tokenizer.json, exactly as Hugging Face
// tokenizers' encode(text, add_special_tokens=False) (added and special tokens written in the text are
// recognised); --special adds what transformers would (BOS when tokenizer_config.json says add_bos_token).
#include <cstdio>
#include <cxxopts.hpp>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.h"
#include "deepinfer/error.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::cli {

namespace {

std::string ids_to_json(const std::vector<int32_t>& ids) {
    std::string s = "[";
    for (size_t i = 0; i < ids.size(); ++i) {
        if (i) s += ", ";
        s += std::to_string(ids[i]);
    }
    return s + "]";
}

std::vector<int32_t> parse_ids(const std::string& text, const std::string& where) {
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
        DI_THROW(where, ": not valid JSON (", e.what(), ")");
    }
    DI_CHECK(j.is_array(), where, ": expected a JSON array of token ids");
    std::vector<int32_t> ids;
    for (const auto& v : j) {
        DI_CHECK(v.is_number_integer(), where, ": token ids must be integers");
        int64_t id = v.get<int64_t>();
        DI_CHECK(id >= 0 && id <= INT32_MAX, where, ": token id ", id, " is out of range");
        ids.push_back(static_cast<int32_t>(id));
    }
    return ids;
}

}  // namespace

int cmd_tokenize(int argc, char** argv) {
    cxxopts::Options opts("deepinfer tokenize",
                          "Encode text to token ids (or decode ids to text) with a Hugging Face tokenizer.json.");
    opts.add_options()("tokenizer", "tokenizer.json, tokenizer.json.gz or a directory holding one",
                       cxxopts::value<std::string>())(
        "text", "text to encode (with --decode: a JSON array of ids; the text is printed as is)",
        cxxopts::value<std::string>())(
        "jsonl",
        "file ('-' for stdin) with one JSON string per line; writes one JSON array of ids per line "
        "(with --decode: reads arrays, writes JSON strings)",
        cxxopts::value<std::string>())("special", "add special tokens (BOS/EOS) as transformers would")(
        "decode", "decode ids to text instead")("skip-special", "with --decode: leave out special tokens")("h,help",
                                                                                                           "show help");
    auto args = opts.parse(argc, argv);
    if (args.count("help")) {
        std::printf("%s\n", opts.help().c_str());
        return 0;
    }
    DI_CHECK(args.count("tokenizer"), "--tokenizer is required (see --help)");
    DI_CHECK(args.count("text") + args.count("jsonl") == 1, "give exactly one of --text and --jsonl (see --help)");
    const Tokenizer tok = Tokenizer::from_file(args["tokenizer"].as<std::string>());
    const bool decode = args.count("decode") > 0;
    const bool special = args.count("special") > 0;
    const bool skip_special = args.count("skip-special") > 0;

    if (args.count("text")) {
        const std::string text = args["text"].as<std::string>();
        if (decode) {
            std::string out = tok.decode(parse_ids(text, "--text"), skip_special);
            std::fwrite(out.data(), 1, out.size(), stdout);
        } else {
            std::printf("%s\n", ids_to_json(tok.encode(text, special)).c_str());
        }
        return 0;
    }

    const std::string path = args["jsonl"].as<std::string>();
    std::ifstream file;
    if (path != "-") {
        file.open(path);
        DI_CHECK(file.good(), "cannot open ", path);
    }
    std::istream& in = path == "-" ? std::cin : file;
    std::string line, out;
    size_t line_no = 0;
    while (std::getline(in, line)) {
        ++line_no;
        if (!line.empty() && line.back() == '\r') line.pop_back();
        const std::string where = path + ":" + std::to_string(line_no);
        if (decode) {
            out = nlohmann::json(tok.decode(parse_ids(line, where), skip_special)).dump();
        } else {
            nlohmann::json j;
            try {
                j = nlohmann::json::parse(line);
            } catch (const nlohmann::json::exception& e) {
                DI_THROW(where, ": not valid JSON (", e.what(), ")");
            }
            DI_CHECK(j.is_string(), where, ": expected a JSON string");
            try {
                out = ids_to_json(tok.encode(j.get_ref<const std::string&>(), special));
            } catch (const Error& e) {
                DI_THROW(where, ": ", e.what());
            }
        }
        out.push_back('\n');
        std::fwrite(out.data(), 1, out.size(), stdout);
    }
    return 0;
}

}  // namespace deepinfer::cli
