// ptx_parse.cpp — PTX text to the decoded form of ptx_ir.h, once per module load.
//
// A small hand-written lexer and recursive reader: PTX is regular (statements end in `;`,
// labels in `:`, scopes are braces), and what nvcc emits uses a small part of the grammar.
// Every instruction is decoded completely here; the executor never looks at text again.
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <stdexcept>

#include "ptx_ir.h"

namespace standin::ptx {

namespace {

const std::map<std::string, Ty>& type_names() {
    static const std::map<std::string, Ty> m = {
        {"pred", Ty::Pred}, {"b8", Ty::B8},   {"b16", Ty::B16},   {"b32", Ty::B32},   {"b64", Ty::B64},
        {"u8", Ty::U8},     {"u16", Ty::U16}, {"u32", Ty::U32},   {"u64", Ty::U64},   {"s8", Ty::S8},
        {"s16", Ty::S16},   {"s32", Ty::S32}, {"s64", Ty::S64},   {"f16", Ty::F16},   {"f16x2", Ty::F16x2},
        {"bf16", Ty::BF16}, {"bf16x2", Ty::BF16x2}, {"f32", Ty::F32}, {"f64", Ty::F64},
    };
    return m;
}

const std::map<std::string, Op>& op_names() {
    static const std::map<std::string, Op> m = {
        {"mov", Op::Mov},       {"add", Op::Add},         {"sub", Op::Sub},       {"mul", Op::Mul},
        {"mad", Op::Mad},       {"mul24", Op::Mul24},     {"mad24", Op::Mad24},   {"div", Op::Div},
        {"rem", Op::Rem},       {"abs", Op::Abs},         {"neg", Op::Neg},       {"min", Op::Min},
        {"max", Op::Max},       {"fma", Op::Fma},         {"and", Op::And},       {"or", Op::Or},
        {"xor", Op::Xor},       {"not", Op::Not},         {"cnot", Op::Cnot},     {"shl", Op::Shl},
        {"shr", Op::Shr},       {"popc", Op::Popc},       {"clz", Op::Clz},       {"brev", Op::Brev},
        {"bfe", Op::Bfe},       {"bfi", Op::Bfi},         {"prmt", Op::Prmt},     {"copysign", Op::Copysign},
        {"selp", Op::Selp},     {"setp", Op::Setp},       {"set", Op::Set},       {"cvt", Op::Cvt},
        {"cvta", Op::Cvta},     {"rcp", Op::Rcp},         {"sqrt", Op::Sqrt},     {"rsqrt", Op::Rsqrt},
        {"ex2", Op::Ex2},       {"lg2", Op::Lg2},         {"sin", Op::Sin},       {"cos", Op::Cos},
        {"tanh", Op::Tanh},     {"testp", Op::Testp},     {"ld", Op::Ld},         {"ldu", Op::Ld},
        {"st", Op::St},         {"atom", Op::Atom},       {"red", Op::Red},       {"bra", Op::Bra},
        {"ret", Op::Ret},       {"exit", Op::Exit},       {"trap", Op::Trap},     {"bar", Op::BarSync},
        {"barrier", Op::BarSync}, {"membar", Op::Membar}, {"fence", Op::Fence},   {"shfl", Op::Shfl},
        {"vote", Op::Vote},     {"activemask", Op::Activemask}, {"wmma", Op::WmmaMma}, {"prefetch", Op::Nop},
        {"prefetchu", Op::Nop}, {"nanosleep", Op::Nop},
    };
    return m;
}

const std::map<std::string, Special>& special_names() {
    static const std::map<std::string, Special> m = {
        {"%tid.x", Special::TidX},         {"%tid.y", Special::TidY},         {"%tid.z", Special::TidZ},
        {"%ntid.x", Special::NtidX},       {"%ntid.y", Special::NtidY},       {"%ntid.z", Special::NtidZ},
        {"%ctaid.x", Special::CtaidX},     {"%ctaid.y", Special::CtaidY},     {"%ctaid.z", Special::CtaidZ},
        {"%nctaid.x", Special::NctaidX},   {"%nctaid.y", Special::NctaidY},   {"%nctaid.z", Special::NctaidZ},
        {"%laneid", Special::LaneId},      {"%warpid", Special::WarpId},      {"%nwarpid", Special::NWarpId},
        {"%smid", Special::SmId},          {"%nsmid", Special::NSmId},        {"%gridid", Special::GridId},
        {"%lanemask_eq", Special::LanemaskEq}, {"%lanemask_lt", Special::LanemaskLt},
        {"%lanemask_le", Special::LanemaskLe}, {"%lanemask_gt", Special::LanemaskGt},
        {"%lanemask_ge", Special::LanemaskGe}, {"%clock", Special::Clock},   {"%clock64", Special::Clock64},
        {"%globaltimer", Special::GlobalTimer}, {"%dynamic_smem_size", Special::DynamicSmemSize},
        {"%total_smem_size", Special::TotalSmemSize},
    };
    return m;
}

// ---------------------------------------------------------------------------------- lexer
enum class Tk { Word, Number, Punct, String, End };

struct Token {
    Tk kind;
    std::string text;
    unsigned line;
};

bool word_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '$' || c == '%'; }
bool word_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '$' || c == '%'; }

std::vector<Token> lex(const std::string& s) {
    std::vector<Token> out;
    unsigned line = 1;
    std::size_t i = 0, n = s.size();
    while (i < n) {
        char c = s[i];
        if (c == '\n') { ++line; ++i; continue; }
        if (std::isspace(static_cast<unsigned char>(c))) { ++i; continue; }
        if (c == '/' && i + 1 < n && s[i + 1] == '/') {
            while (i < n && s[i] != '\n') ++i;
            continue;
        }
        if (c == '/' && i + 1 < n && s[i + 1] == '*') {
            i += 2;
            while (i + 1 < n && !(s[i] == '*' && s[i + 1] == '/')) { if (s[i] == '\n') ++line; ++i; }
            i += 2;
            continue;
        }
        if (c == '"') {
            std::size_t j = i + 1;
            while (j < n && s[j] != '"') ++j;
            out.push_back({Tk::String, s.substr(i + 1, j - i - 1), line});
            i = j + 1;
            continue;
        }
        if (word_start(c)) {
            std::size_t j = i + 1;
            for (;;) {
                if (j < n && word_char(s[j])) { ++j; continue; }
                // Cache-policy modifiers: .L1::evict_last, .L2::128B.
                if (j + 2 < n && s[j] == ':' && s[j + 1] == ':' && word_char(s[j + 2])) { j += 2; continue; }
                break;
            }
            out.push_back({Tk::Word, s.substr(i, j - i), line});
            i = j;
            continue;
        }
        if (std::isdigit(static_cast<unsigned char>(c))) {
            std::size_t j = i + 1;
            while (j < n && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '.')) ++j;
            out.push_back({Tk::Number, s.substr(i, j - i), line});
            i = j;
            continue;
        }
        out.push_back({Tk::Punct, std::string(1, c), line});
        ++i;
    }
    out.push_back({Tk::End, "", line});
    return out;
}

struct ParseError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

std::uint64_t parse_uint(const std::string& t) {
    char* end = nullptr;
    std::uint64_t v;
    if (t.size() > 2 && t[0] == '0' && (t[1] == 'x' || t[1] == 'X'))
        v = std::strtoull(t.c_str() + 2, &end, 16);
    else
        v = std::strtoull(t.c_str(), &end, 10);
    if (end && *end == 'U') ++end;  // 123U
    if (!end || *end) throw ParseError("bad integer `" + t + "`");
    return v;
}

// ---------------------------------------------------------------------------------- reader
class Reader {
public:
    explicit Reader(const std::string& text) : toks_(lex(text)) {}

    void module(Module& m) {
        while (peek().kind != Tk::End) {
            const Token& t = peek();
            if (t.text == ".version") {
                next();
                std::string v = next().text;  // "9.0" lexes as one number
                unsigned maj = 0, min = 0;
                std::sscanf(v.c_str(), "%u.%u", &maj, &min);
                m.isa = maj * 10 + min;
            } else if (t.text == ".target") {
                next();
                for (;;) {
                    std::string w = next().text;
                    if (w.rfind("sm_", 0) == 0) m.target = static_cast<unsigned>(std::atoi(w.c_str() + 3));
                    if (peek().text != ",") break;
                    next();
                }
            } else if (t.text == ".address_size") {
                next();
                if (next().text != "64") throw ParseError("only .address_size 64 is supported");
            } else if (t.text == ".file" || t.text == ".loc") {
                skip_line();
            } else if (t.text == ".section") {
                next();
                next();
                skip_braces();
            } else if (t.text == ".visible" || t.text == ".weak" || t.text == ".extern" || t.text == ".entry" ||
                       t.text == ".func" || t.text == ".shared" || t.text == ".global" || t.text == ".const") {
                bool external = false;
                while (peek().text == ".visible" || peek().text == ".weak" || peek().text == ".extern") {
                    external |= peek().text == ".extern";
                    next();
                }
                std::string what = next().text;
                if (what == ".entry") {
                    Kernel k;
                    k.symbols = module_symbols_;
                    k.static_shared = module_shared_;
                    std::size_t start = pos_;
                    try {
                        entry(k);
                    } catch (const ParseError& e) {
                        // One kernel the executor cannot read does not hide the others: the
                        // module keeps it, marked, and launching it names the reason.
                        k.code.clear();
                        k.error = e.what();
                        pos_ = start;
                        skip_to_body_end();
                    }
                    m.kernels.push_back(std::move(k));
                } else if (what == ".func") {
                    // Device functions are kept out: a kernel that calls one fails on `call`.
                    skip_to_body_end();
                } else if (what == ".shared") {
                    Symbol s = variable(Space::Shared, external);
                    place(s, module_shared_);
                    module_symbols_.push_back(s);
                } else if (what == ".global" || what == ".const") {
                    // Not backed by memory (NVRTC's headers declare such helpers, e.g.
                    // __nv_atomic_triv_cp_helper, that no kernel here touches): kept out, as
                    // .func is; a kernel that addresses one cannot run, and says which.
                    std::string name;
                    while (peek().kind != Tk::End && peek().text != ";") {
                        const Token& x = next();
                        if (x.text == "=") {  // an initializer: skip it
                            while (peek().kind != Tk::End && peek().text != ";") next();
                            break;
                        }
                        if (x.kind == Tk::Word && x.text[0] != '.') name = x.text;
                    }
                    if (peek().kind == Tk::End) throw ParseError("line " + std::to_string(t.line) + ": unterminated " + what + " variable");
                    next();
                    unbacked_.push_back(name);
                } else {
                    throw ParseError("line " + std::to_string(t.line) + ": unexpected module-scope `" + what + "`");
                }
            } else {
                throw ParseError("line " + std::to_string(t.line) + ": unexpected `" + t.text + "` at module scope");
            }
        }
    }

    std::vector<std::pair<std::string, unsigned>> opcodes;  // every instruction seen: spelling, line

private:
    std::vector<Token> toks_;
    std::size_t pos_ = 0;
    std::vector<Symbol> module_symbols_;
    std::vector<std::string> unbacked_;  // module-scope .global / .const variables
    std::uint64_t module_shared_ = 0;

    // Per kernel.
    std::vector<std::map<std::string, std::int32_t>> scopes_;
    std::map<std::string, std::int32_t> labels_;
    std::vector<std::pair<std::size_t, std::string>> fixups_;  // instruction index, label
    Kernel* k_ = nullptr;

    const Token& peek(std::size_t ahead = 0) const { return toks_[std::min(pos_ + ahead, toks_.size() - 1)]; }
    const Token& next() {
        const Token& t = toks_[pos_];
        if (pos_ + 1 < toks_.size()) ++pos_;
        return t;
    }
    void expect(const char* p) {
        const Token& t = next();
        if (t.text != p)
            throw ParseError("line " + std::to_string(t.line) + ": expected `" + p + "`, found `" + t.text + "`");
    }
    void skip_line() {
        unsigned line = peek().line;
        while (peek().kind != Tk::End && peek().line == line) next();
    }
    void skip_braces() {
        while (peek().kind != Tk::End && peek().text != "{") next();
        int depth = 0;
        do {
            const Token& t = next();
            if (t.text == "{") ++depth;
            if (t.text == "}") --depth;
            if (t.kind == Tk::End) return;
        } while (depth > 0);
    }
    // From a .entry or .func header to the end of its body (or its `;` when it has none).
    void skip_to_body_end() {
        while (peek().kind != Tk::End && peek().text != "{" && peek().text != ";") next();
        if (peek().text == ";") { next(); return; }
        skip_braces();
    }

    static void place(Symbol& s, std::uint64_t& cursor) {
        if (s.dynamic) return;
        cursor = (cursor + s.align - 1) / s.align * s.align;
        s.offset = cursor;
        cursor += s.size;
    }

    // `.align A .type name[N]` (after the state space), up to and including `;`.
    Symbol variable(Space space, bool external) {
        Symbol s;
        s.space = space;
        Ty t = Ty::B8;
        while (peek().kind == Tk::Word && peek().text[0] == '.') {
            std::string w = next().text;
            if (w == ".align") {
                s.align = static_cast<std::uint32_t>(parse_uint(next().text));
            } else {
                auto it = type_names().find(w.substr(1));
                if (it == type_names().end()) throw ParseError("line " + std::to_string(peek().line) + ": unknown `" + w + "`");
                t = it->second;
            }
        }
        s.name = next().text;
        std::uint64_t elems = 1;
        while (peek().text == "[") {
            next();
            if (peek().text == "]") {
                s.dynamic = true;
            } else {
                elems *= parse_uint(next().text);
            }
            expect("]");
        }
        if (peek().text == "=") throw ParseError("line " + std::to_string(peek().line) + ": initialised variables are not supported");
        expect(";");
        s.size = s.dynamic ? 0 : elems * std::max(1u, bits_of(t) / 8);
        if (s.align < std::max(1u, bits_of(t) / 8)) s.align = std::max(1u, bits_of(t) / 8);
        if (s.dynamic && !external && space == Space::Shared) throw ParseError("unsized .shared array that is not .extern");
        return s;
    }

    std::int32_t new_slot() {
        if (k_->slots >= 32767) throw ParseError("more than 32767 registers in one kernel");
        return static_cast<std::int32_t>(k_->slots++);
    }

    void declare(const std::string& name, std::int32_t slot) { scopes_.back()[name] = slot; }

    std::int32_t lookup_reg(const std::string& name, unsigned line) {
        for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
            auto f = it->find(name);
            if (f != it->end()) return f->second;
        }
        auto sp = special_names().find(name);
        if (sp != special_names().end()) return static_cast<std::int32_t>(sp->second);
        throw ParseError("line " + std::to_string(line) + ": undeclared register `" + name + "`");
    }

    [[noreturn]] void unknown_symbol(const std::string& name, unsigned line) const {
        if (std::find(unbacked_.begin(), unbacked_.end(), name) != unbacked_.end())
            throw ParseError("line " + std::to_string(line) + ": uses the module-scope variable `" + name +
                             "`; .global and .const variables are not supported by the PTX executor");
        throw ParseError("line " + std::to_string(line) + ": unknown symbol `" + name + "`");
    }

    std::int32_t symbol_index(const std::string& name) const {
        for (std::size_t i = 0; i < k_->symbols.size(); ++i)
            if (k_->symbols[i].name == name) return static_cast<std::int32_t>(i);
        return -1;
    }

    void entry(Kernel& k) {
        k_ = &k;
        k.slots = static_cast<std::uint32_t>(Special::Count);
        k.name = next().text;
        scopes_.assign(1, {});
        labels_.clear();
        fixups_.clear();
        expect("(");
        while (peek().text != ")") {
            expect(".param");
            Param p;
            std::uint32_t align = 0;
            Ty t = Ty::None;
            while (peek().kind == Tk::Word && peek().text[0] == '.') {
                std::string w = next().text;
                if (w == ".align") { align = static_cast<std::uint32_t>(parse_uint(next().text)); continue; }
                if (w == ".ptr" || w == ".global" || w == ".shared" || w == ".const" || w == ".local") continue;
                auto it = type_names().find(w.substr(1));
                if (it == type_names().end()) throw ParseError("parameter type `" + w + "` is not supported");
                t = it->second;
            }
            p.name = next().text;
            p.type = t;
            std::uint32_t elem = std::max(1u, bits_of(t) / 8), count = 1;
            if (peek().text == "[") {
                next();
                count = static_cast<std::uint32_t>(parse_uint(next().text));
                expect("]");
            }
            p.bytes = elem * count;
            if (p.bytes > 8)
                throw ParseError("parameter `" + p.name + "` of " + std::to_string(p.bytes) +
                                 " bytes: the stand-in passes arguments of at most 8 bytes");
            if (!align) align = elem;
            k.param_bytes = (k.param_bytes + align - 1) / align * align;
            p.offset = k.param_bytes;
            k.param_bytes += p.bytes;
            Symbol s;
            s.name = p.name;
            s.space = Space::Param;
            s.offset = p.offset;
            s.size = p.bytes;
            k.symbols.push_back(s);
            k.params.push_back(p);
            if (peek().text == ",") next();
        }
        expect(")");
        // Performance directives.
        while (peek().kind == Tk::Word && peek().text[0] == '.' && peek().text != ".reg") {
            std::string w = next().text;
            std::vector<std::uint64_t> vals;
            while (peek().kind == Tk::Number) {
                vals.push_back(parse_uint(next().text));
                if (peek().text == ",") next();
            }
            if (w == ".maxntid" || w == ".reqntid") {
                std::uint64_t prod = 1;
                for (auto v : vals) prod *= v;
                k.maxntid = static_cast<unsigned>(prod);
            }
        }
        if (peek().text == ";") { next(); throw ParseError("kernel `" + k.name + "` has no body"); }
        expect("{");
        body();
        for (auto& [at, label] : fixups_) {
            auto it = labels_.find(label);
            if (it == labels_.end()) throw ParseError("branch to undefined label `" + label + "`");
            k.code[at].ops[0].reg = it->second;
        }
        // A kernel that falls off its end returns.
        Instr ret;
        ret.op = Op::Ret;
        k.code.push_back(ret);
        k.text.push_back("ret (end of kernel)");
        k_ = nullptr;
    }

    void body() {
        int depth = 1;
        while (depth > 0) {
            const Token& t = peek();
            if (t.kind == Tk::End) throw ParseError("unterminated kernel body");
            if (t.text == "{") { next(); ++depth; scopes_.emplace_back(); continue; }
            if (t.text == "}") { next(); --depth; if (depth > 0) scopes_.pop_back(); continue; }
            if (t.text == ".loc" || t.text == ".file") { skip_line(); continue; }
            if (t.text == ".pragma") { next(); while (next().text != ";") {} continue; }
            if (t.text == ".reg") { next(); registers(); continue; }
            if (t.text == ".shared" || t.text == ".local") {
                next();
                Space sp = t.text == ".shared" ? Space::Shared : Space::Local;
                Symbol s = variable(sp, false);
                if (sp == Space::Shared) place(s, k_->static_shared);
                else place(s, k_->local_bytes);
                k_->symbols.push_back(s);
                continue;
            }
            if (t.kind == Tk::Word && peek(1).text == ":" ) {
                labels_[t.text] = static_cast<std::int32_t>(k_->code.size());
                next();
                next();
                continue;
            }
            instruction();
        }
    }

    void registers() {
        std::string type = next().text;  // .b32, .v2? not emitted
        if (type == ".v2" || type == ".v4") throw ParseError("vector registers are not supported");
        for (;;) {
            std::string name = next().text;
            if (peek().text == "<") {
                next();
                std::uint64_t n = parse_uint(next().text);
                expect(">");
                for (std::uint64_t i = 0; i < n; ++i) declare(name + std::to_string(i), new_slot());
            } else {
                declare(name, new_slot());
            }
            if (peek().text == ",") { next(); continue; }
            break;
        }
        expect(";");
    }

    // ------------------------------------------------------------------ instructions
    void instruction() {
        Instr in;
        unsigned line = peek().line;
        in.line = line;
        std::string text;
        if (peek().text == "@") {
            next();
            text += "@";
            if (peek().text == "!") { next(); in.guard_negate = true; text += "!"; }
            std::string p = next().text;
            text += p + " ";
            in.guard = lookup_reg(p, line);
        }
        const Token& optok = next();
        if (optok.kind != Tk::Word)
            throw ParseError("line " + std::to_string(line) + ": expected an instruction, found `" + optok.text + "`");
        std::string opcode = optok.text;
        text += opcode;
        opcodes.emplace_back(opcode, line);
        decode_opcode(opcode, in, line);
        // Operands.
        std::vector<std::string> raw;
        unsigned n = 0;
        bool first = true;
        while (peek().text != ";") {
            if (!first) expect(",");
            first = false;
            if (n >= 5) throw ParseError("line " + std::to_string(line) + ": too many operands");
            std::string otext;
            in.ops[n] = operand(in, n, line, otext);
            text += (n ? ", " : " ") + otext;
            // `%r|%p`: a second predicate destination (setp, shfl).
            if (peek().text == "|") {
                next();
                std::string p = next().text;
                text += "|" + p;
                in.pred_out = lookup_reg(p, line);
            }
            ++n;
        }
        next();  // ;
        in.nops = static_cast<std::uint8_t>(n);
        if (in.op == Op::St || in.op == Op::Atom || in.op == Op::Red || in.op == Op::WmmaStoreD) {
            if (in.space == Space::Global || in.space == Space::Generic) k_->writes_global = true;
        }
        validate(in, line, opcode);
        k_->code.push_back(in);
        k_->text.push_back(text);
    }

    Operand operand(const Instr& in, unsigned index, unsigned line, std::string& text) {
        Operand o;
        const Token& t = peek();
        if (t.text == "[") {
            next();
            text = "[";
            o.kind = OperandKind::Addr;
            bool have_base = false;
            while (peek().text != "]") {
                const Token& u = next();
                text += u.text;
                if (u.text == "+") continue;
                if (u.text == "-") {
                    const Token& num = next();
                    text += num.text;
                    o.addr.offset -= static_cast<std::int64_t>(parse_uint(num.text));
                    continue;
                }
                if (u.kind == Tk::Number) {
                    o.addr.offset += static_cast<std::int64_t>(parse_uint(u.text));
                } else if (!have_base && u.text[0] == '%') {
                    o.addr.reg = lookup_reg(u.text, line);
                    have_base = true;
                } else if (!have_base) {
                    o.addr.symbol = symbol_index(u.text);
                    if (o.addr.symbol < 0) unknown_symbol(u.text, line);
                    have_base = true;
                } else {
                    throw ParseError("line " + std::to_string(line) + ": bad address near `" + u.text + "`");
                }
            }
            next();
            text += "]";
            return o;
        }
        if (t.text == "{") {
            next();
            text = "{";
            o.kind = OperandKind::Vec;
            while (peek().text != "}") {
                if (o.count) { expect(","); text += ","; }
                const Token& rt = next();
                std::string r = rt.text;
                text += r;
                if (o.count >= 8) throw ParseError("line " + std::to_string(line) + ": vector of more than 8 registers");
                if (rt.kind == Tk::Number) {  // `{0, %rs1}`: packing an immediate
                    std::int32_t slot = new_slot();
                    k_->constants.emplace_back(static_cast<std::uint32_t>(slot), parse_uint(r));
                    o.vec[o.count++] = static_cast<std::int16_t>(slot);
                    continue;
                }
                o.vec[o.count++] = static_cast<std::int16_t>(r == "_" ? -1 : lookup_reg(r, line));
            }
            next();
            text += "}";
            return o;
        }
        if (t.text == "!") {
            next();
            o.negate = true;
            text = "!";
        }
        if (peek().text == "-" && peek(1).kind == Tk::Number) {
            next();
            std::string num = next().text;
            text += "-" + num;
            o.kind = OperandKind::Imm;
            o.imm = static_cast<std::uint64_t>(-static_cast<std::int64_t>(parse_uint(num)));
            return o;
        }
        const Token& u = next();
        text += u.text;
        if (u.kind == Tk::Number) {
            o.kind = OperandKind::Imm;
            const std::string& s = u.text;
            if (s.size() > 2 && s[0] == '0' && (s[1] == 'f' || s[1] == 'F')) {
                o.imm = std::strtoull(s.c_str() + 2, nullptr, 16);
            } else if (s.size() > 2 && s[0] == '0' && (s[1] == 'd' || s[1] == 'D')) {
                o.imm = std::strtoull(s.c_str() + 2, nullptr, 16);
                o.imm_is_double = true;
            } else if (s.find('.') != std::string::npos || s.find('e') != std::string::npos) {
                double d = std::strtod(s.c_str(), nullptr);
                std::memcpy(&o.imm, &d, 8);
                o.imm_is_double = true;
            } else {
                o.imm = parse_uint(s);
            }
            return o;
        }
        if (u.text == "_") {
            o.kind = OperandKind::Sink;
            return o;
        }
        if (u.text[0] == '%') {
            o.kind = OperandKind::Reg;
            o.reg = lookup_reg(u.text, line);
            return o;
        }
        if (in.op == Op::Bra) {
            o.kind = OperandKind::Label;
            fixups_.emplace_back(k_->code.size(), u.text);
            return o;
        }
        // A symbol used as a value: its address in its state space.
        std::int32_t s = symbol_index(u.text);
        if (s < 0) unknown_symbol(u.text, line);
        o.kind = OperandKind::Addr;
        o.addr.symbol = s;
        (void)index;
        return o;
    }

    static Round round_of(const std::string& m) {
        static const std::map<std::string, Round> r = {
            {"rn", Round::Rn},   {"rz", Round::Rz},   {"rm", Round::Rm},   {"rp", Round::Rp},   {"rna", Round::Rna},
            {"rni", Round::Rni}, {"rzi", Round::Rzi}, {"rmi", Round::Rmi}, {"rpi", Round::Rpi},
        };
        auto it = r.find(m);
        return it == r.end() ? Round::Default : it->second;
    }

    static bool cmp_of(const std::string& m, Cmp& c) {
        static const std::map<std::string, Cmp> t = {
            {"eq", Cmp::Eq},   {"ne", Cmp::Ne},   {"lt", Cmp::Lt},   {"le", Cmp::Le},   {"gt", Cmp::Gt},
            {"ge", Cmp::Ge},   {"lo", Cmp::Lo},   {"ls", Cmp::Ls},   {"hi", Cmp::Hi},   {"hs", Cmp::Hs},
            {"equ", Cmp::Equ}, {"neu", Cmp::Neu}, {"ltu", Cmp::Ltu}, {"leu", Cmp::Leu}, {"gtu", Cmp::Gtu},
            {"geu", Cmp::Geu}, {"num", Cmp::Num}, {"nan", Cmp::Nan},
        };
        auto it = t.find(m);
        if (it == t.end()) return false;
        c = it->second;
        return true;
    }

    static bool space_of(const std::string& m, Space& s) {
        if (m == "global") { s = Space::Global; return true; }
        if (m == "shared" || m == "shared::cta") { s = Space::Shared; return true; }
        if (m == "local") { s = Space::Local; return true; }
        if (m == "param" || m == "param::entry") { s = Space::Param; return true; }
        if (m == "const") { s = Space::Const; return true; }
        return false;
    }

    [[noreturn]] static void unknown(const std::string& opcode, const std::string& what, unsigned line) {
        throw ParseError("line " + std::to_string(line) + ": `" + opcode + "`: " + what +
                         " is not implemented by the PTX executor");
    }

    void decode_opcode(const std::string& opcode, Instr& in, unsigned line) {
        std::vector<std::string> parts;
        std::size_t start = 0;
        for (std::size_t i = 0; i <= opcode.size(); ++i) {
            if (i == opcode.size() || opcode[i] == '.') {
                parts.push_back(opcode.substr(start, i - start));
                start = i + 1;
            }
        }
        auto it = op_names().find(parts[0]);
        if (it == op_names().end()) unknown(opcode, "the instruction `" + parts[0] + "`", line);
        in.op = it->second;
        if (parts[0] == "wmma") { wmma(parts, in, opcode, line); return; }
        std::vector<Ty> types;
        for (std::size_t i = 1; i < parts.size(); ++i) {
            const std::string& m = parts[i];
            auto ty = type_names().find(m);
            if (ty != type_names().end()) { types.push_back(ty->second); continue; }
            Round r = round_of(m);
            if (r != Round::Default) { in.round = r; continue; }
            Space sp;
            if (space_of(m, sp)) {
                // cvta.to.global: the space converted to; cvta.shared: from.
                in.space = sp;
                continue;
            }
            if (m == "ftz") { in.ftz = true; continue; }
            if (m == "sat") { in.sat = true; continue; }
            if (m == "approx") { in.approx = true; continue; }
            if (m == "full") continue;  // div.full: within 2 ulp over the whole range; run exactly
            if (m == "volatile") { in.volatile_ = true; continue; }
            if (m == "uni") { in.uniform = true; continue; }
            if (m == "v2") { in.vec = 2; continue; }
            if (m == "v4") { in.vec = 4; continue; }
            if (m == "to") { in.sub = Sub::ToSpace; continue; }
            if (m == "lo") {
                if (in.op == Op::Mul || in.op == Op::Mad || in.op == Op::Mul24 || in.op == Op::Mad24) { in.sub = Sub::Lo; continue; }
            }
            if (m == "hi") {
                if (in.op == Op::Mul || in.op == Op::Mad || in.op == Op::Mul24 || in.op == Op::Mad24) { in.sub = Sub::Hi; continue; }
            }
            if (m == "wide") { in.sub = Sub::Wide; continue; }
            if (in.op == Op::Setp || in.op == Op::Set) {
                Cmp c;
                if (cmp_of(m, c)) { in.cmp = c; continue; }
                if (m == "and") { in.boolop = BoolOp::And; continue; }
                if (m == "or") { in.boolop = BoolOp::Or; continue; }
                if (m == "xor") { in.boolop = BoolOp::Xor; continue; }
            }
            if (in.op == Op::Testp) {
                static const std::map<std::string, Cmp> tests = {
                    {"finite", Cmp::Eq}, {"infinite", Cmp::Ne}, {"number", Cmp::Num}, {"notanumber", Cmp::Nan},
                    {"normal", Cmp::Lt}, {"subnormal", Cmp::Le}};
                auto f = tests.find(m);
                if (f != tests.end()) { in.cmp = f->second; continue; }
            }
            if (in.op == Op::Atom || in.op == Op::Red) {
                static const std::map<std::string, Sub> subs = {
                    {"add", Sub::Add}, {"inc", Sub::Inc}, {"dec", Sub::Dec}, {"min", Sub::MinA}, {"max", Sub::MaxA},
                    {"and", Sub::AndA}, {"or", Sub::OrA}, {"xor", Sub::XorA}, {"exch", Sub::Exch}, {"cas", Sub::Cas}};
                auto f = subs.find(m);
                if (f != subs.end()) { in.sub = f->second; continue; }
            }
            if (in.op == Op::Shfl) {
                static const std::map<std::string, Sub> subs = {
                    {"up", Sub::Up}, {"down", Sub::Down}, {"bfly", Sub::Bfly}, {"idx", Sub::Idx}};
                auto f = subs.find(m);
                if (f != subs.end()) { in.sub = f->second; continue; }
            }
            if (in.op == Op::Vote) {
                static const std::map<std::string, Sub> subs = {
                    {"all", Sub::All}, {"any", Sub::Any}, {"uni", Sub::Uni}, {"ballot", Sub::Ballot}};
                auto f = subs.find(m);
                if (f != subs.end()) { in.sub = f->second; continue; }
            }
            if (in.op == Op::BarSync && (m == "sync" || m == "cta" || m == "aligned")) continue;
            if (in.op == Op::BarSync && m == "warp") { in.op = Op::BarWarpSync; continue; }
            if (in.op == Op::Membar && m == "gl") continue;  // device scope: a fence (executor)
            // Hints and orderings that do not change a sequential execution's results.
            static const std::set<std::string> ignored = {
                "nc", "ca", "cg", "cs", "lu", "cv", "wb", "wt", "sync", "aligned", "relaxed", "acquire", "release",
                "acq_rel", "sc", "cta", "gpu", "sys", "weak", "L1::no_allocate", "L1::evict_last", "L1::evict_first",
                "L1::evict_normal", "L2::64B", "L2::128B", "L2::256B", "L1::evict_unchanged", "L2::evict_last",
                "L2::evict_first", "L2::evict_normal"};
            if (ignored.count(m)) continue;
            if (in.op == Op::Nop && (m == "L1" || m == "L2")) continue;
            unknown(opcode, "the modifier `." + m + "`", line);
        }
        if (in.op == Op::Cvta && in.sub != Sub::ToSpace) in.sub = Sub::FromSpace;
        if (!types.empty()) in.type = types[0];
        if (types.size() > 1) in.type2 = types[1];
        if (in.op == Op::Set && types.size() > 1) { in.type2 = types[1]; }
        if (in.op == Op::Cvt && types.size() != 2) unknown(opcode, "cvt without two types", line);
        if (in.op == Op::Bfi || in.op == Op::Selp || in.op == Op::Prmt) {}
    }

    void wmma(const std::vector<std::string>& parts, Instr& in, const std::string& opcode, unsigned line) {
        // wmma.load.{a,b,c}.sync.aligned.<layout>.m16n16k16[.<space>].<type>
        // wmma.store.d.sync.aligned.<layout>.m16n16k16[.<space>].<type>
        // wmma.mma.sync.aligned.<alayout>.<blayout>.m16n16k16.<dtype>.<ctype>           (f16 inputs)
        // wmma.mma.sync.aligned.<alayout>.<blayout>.m16n16k16.f32.bf16.bf16.f32        (bf16 inputs)
        if (parts.size() < 2) unknown(opcode, "this wmma form", line);
        std::vector<std::string> rest(parts.begin() + 2, parts.end());
        bool shape = false;
        std::vector<bool> layouts;
        std::vector<Ty> types;
        std::string which;
        for (const std::string& m : rest) {
            if (m == "a" || m == "b" || m == "c" || m == "d") { which = m; continue; }
            if (m == "sync" || m == "aligned") continue;
            if (m == "row") { layouts.push_back(true); continue; }
            if (m == "col") { layouts.push_back(false); continue; }
            if (m == "m16n16k16") { shape = true; continue; }
            Space sp;
            if (space_of(m, sp)) { in.space = sp; continue; }
            auto ty = type_names().find(m);
            if (ty != type_names().end()) { types.push_back(ty->second); continue; }
            unknown(opcode, "the wmma modifier `." + m + "`", line);
        }
        if (!shape) unknown(opcode, "a wmma shape other than m16n16k16", line);
        if (parts[1] == "load" || parts[1] == "store") {
            if (layouts.size() != 1 || types.size() != 1) unknown(opcode, "this wmma form", line);
            in.wmma_a_row = layouts[0];
            in.type = types[0];
            if (parts[1] == "store" && which == "d") in.op = Op::WmmaStoreD;
            else if (which == "a") in.op = Op::WmmaLoadA;
            else if (which == "b") in.op = Op::WmmaLoadB;
            else if (which == "c") in.op = Op::WmmaLoadC;
            else unknown(opcode, "this wmma form", line);
            if ((in.op == Op::WmmaLoadA || in.op == Op::WmmaLoadB) && in.type != Ty::F16 && in.type != Ty::BF16)
                unknown(opcode, "wmma inputs other than f16 and bf16", line);
            if ((in.op == Op::WmmaLoadC || in.op == Op::WmmaStoreD) && in.type != Ty::F16 && in.type != Ty::F32)
                unknown(opcode, "wmma accumulators other than f16 and f32", line);
            return;
        }
        if (parts[1] != "mma" || layouts.size() != 2) unknown(opcode, "this wmma form", line);
        in.op = Op::WmmaMma;
        in.wmma_a_row = layouts[0];
        in.wmma_b_row = layouts[1];
        if (types.size() == 2) {
            in.wmma_ab = Ty::F16;
            in.wmma_d = types[0];
            in.wmma_c = types[1];
        } else if (types.size() == 4 && types[1] == Ty::BF16 && types[2] == Ty::BF16) {
            in.wmma_ab = Ty::BF16;
            in.wmma_d = types[0];
            in.wmma_c = types[3];
        } else {
            unknown(opcode, "this wmma.mma type combination", line);
        }
    }

    // Forms the executor supports, checked once here so that running never meets a surprise.
    void validate(const Instr& in, unsigned line, const std::string& opcode) {
        auto need = [&](bool ok, const char* what) {
            if (!ok) unknown(opcode, what, line);
        };
        switch (in.op) {
            case Op::Ld:
            case Op::St:
                need(in.type != Ty::None, "a load or store without a type");
                need(in.space != Space::Const, "the .const space");
                break;
            case Op::Atom:
            case Op::Red:
                need(in.sub != Sub::None, "an atomic without an operation");
                need(in.space == Space::Global || in.space == Space::Shared || in.space == Space::Generic,
                     "atomics outside global and shared memory");
                need(bits_of(in.type) == 32 || bits_of(in.type) == 64, "atomics narrower than 32 bits");
                break;
            case Op::Shfl:
                need(in.sub != Sub::None && in.type == Ty::B32, "this shfl form");
                break;
            case Op::Vote:
                need(in.sub != Sub::None && in.sub != Sub::Uni, "this vote form");
                break;
            case Op::Mul:
            case Op::Mad:
                if (!is_float(in.type)) need(in.sub != Sub::None, "integer mul/mad without .lo/.hi/.wide");
                break;
            case Op::Cvt:
                need(in.type != Ty::None && in.type2 != Ty::None, "cvt without types");
                break;
            case Op::Sin: case Op::Cos: case Op::Ex2: case Op::Lg2: case Op::Rsqrt: case Op::Tanh:
                need(in.type == Ty::F32 || in.type == Ty::F64, "this type of transcendental");
                break;
            default:
                break;
        }
    }
};

}  // namespace

bool parse(const std::string& text, Module& out, std::string& error) {
    try {
        Reader r(text);
        r.module(out);
        return true;
    } catch (const ParseError& e) {
        error = e.what();
        return false;
    }
}

bool instruction_spellings(const std::string& text, std::vector<std::string>& spellings, std::string& error) {
    Module m;
    Reader r(text);
    try {
        r.module(m);
    } catch (const ParseError& e) {
        error = e.what();
        return false;
    }
    std::set<std::string> seen;
    for (auto& [op, line] : r.opcodes) seen.insert(op);
    spellings.assign(seen.begin(), seen.end());
    for (const Kernel& k : m.kernels) {
        if (!k.error.empty()) {
            error = "kernel `" + k.name + "`: " + k.error;
            return false;
        }
    }
    return true;
}

}  // namespace standin::ptx
