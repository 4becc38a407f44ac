/// One system call as `strace -f -y -xx` printed it: its name, its arguments and its result.
///
/// Only what the explorer needs is kept: strings as bytes (strace prints every byte as `\xHH` with `-xx`), descriptors
/// with the path `-y` gives them, numbers, flag words, arrays and structures (for `writev`'s `iovec`s).
public struct SystemCall: Sendable, Equatable {
    /// The thread that made the call, as strace's `-f` prefix gives it.
    public var threadID: Int
    /// The call's name, such as `pwrite64`.
    public var name: String
    /// The arguments in order.
    public var arguments: [Argument]
    /// The value returned; negative for a failure (its errno is not kept).
    public var result: Int64
    /// The path of the descriptor returned, when `-y` annotated one (`openat` returns `3</path>`).
    public var resultPath: String?

    /// One argument of a call.
    public indirect enum Argument: Sendable, Equatable {
        /// A quoted string, decoded.
        case bytes([UInt8])
        /// A number, or a descriptor (with `-y`, its path).
        case number(Int64, path: String?)
        /// A symbolic word such as `O_WRONLY|O_CREAT` or `AT_FDCWD` (with `-y`, its path).
        case word(String, path: String?)
        /// `[a, b]`.
        case array([Argument])
        /// `{key=value, …}`.
        case structure([(String, Argument)])

        public static func == (lhs: Argument, rhs: Argument) -> Bool {
            switch (lhs, rhs) {
            case (.bytes(let a), .bytes(let b)): a == b
            case (.number(let a, let p), .number(let b, let q)): a == b && p == q
            case (.word(let a, let p), .word(let b, let q)): a == b && p == q
            case (.array(let a), .array(let b)): a == b
            case (.structure(let a), .structure(let b)): a.map(\.0) == b.map(\.0) && a.map(\.1) == b.map(\.1)
            default: false
            }
        }

        /// The number, for a numeric argument.
        public var number: Int64? {
            if case .number(let value, _) = self { return value }
            if case .word(let word, _) = self, let value = Int64(word) { return value }
            return nil
        }

        /// The path strace annotated a descriptor (or `AT_FDCWD`) with.
        public var path: String? {
            switch self {
            case .number(_, let path), .word(_, let path): path
            default: nil
            }
        }

        /// The bytes of a string argument.
        public var bytes: [UInt8]? {
            if case .bytes(let bytes) = self { return bytes }
            return nil
        }

        /// The symbolic words of a flag argument (`O_WRONLY|O_CREAT` gives both).
        public var words: Set<String> {
            if case .word(let word, _) = self { return Set(word.split(separator: "|").map(String.init)) }
            return []
        }
    }
}

/// Why a trace could not be read.
public struct TraceError: Error, CustomStringConvertible, Sendable {
    /// What went wrong, with the line.
    public var description: String

    init(_ description: String) { self.description = description }
}

/// Reads the output of `strace -f -qq -y -xx -s N -o FILE` into calls in the order they completed.
///
/// With `-f` a call that another thread interrupts is printed in two pieces (`<unfinished ...>`, then
/// `<... NAME resumed>`); the pieces are joined, and the call takes its place where it completed, the moment its
/// effect is certain to have happened. Lines that are not calls (signals, exits, a thread detached mid-call) are
/// skipped.
public enum SystemCallTrace: Sendable {
    /// The calls to trace (`strace -e trace=…`): those that change files or say where a descriptor points. `read`s are
    /// left out (their bytes would fill the trace), so that a write without an offset is followed only through
    /// `O_APPEND` or `lseek`.
    public static let tracedCalls = [
        "open", "openat", "creat", "close", "dup", "dup2", "dup3", "fcntl", "lseek",
        "write", "pwrite64", "writev", "pwritev", "pwritev2", "ftruncate", "truncate", "fallocate",
        "fsync", "fdatasync", "sync", "syncfs", "sync_file_range",
        "rename", "renameat", "renameat2", "link", "linkat", "unlink", "unlinkat", "rmdir", "mkdir", "mkdirat",
    ]

    /// Parses a whole trace.
    public static func parse(_ text: String) throws(TraceError) -> [SystemCall] {
        var calls: [SystemCall] = []
        var unfinished: [Int: String] = [:]
        for rawLine in text.split(separator: "\n", omittingEmptySubsequences: true) {
            var line = Substring(rawLine)
            var threadID = 0
            if let first = line.first, first.isNumber {
                let digits = line.prefix { $0.isNumber }
                threadID = Int(digits) ?? 0
                line = line.dropFirst(digits.count).drop { $0 == " " }
            }
            if line.hasPrefix("+++") || line.hasPrefix("---") { continue }
            // A thread strace let go of in the middle of a call, often one it could not name (`???( <detached ...>`),
            // as a process exits on a busy machine: no effect of it is certain, as for a call that never returned.
            if line.hasSuffix("<detached ...>") {
                unfinished[threadID] = nil
                continue
            }
            if line.hasSuffix("<unfinished ...>") {
                unfinished[threadID] = String(line.dropLast("<unfinished ...>".count))
                continue
            }
            var whole = String(line)
            if line.hasPrefix("<... ") {
                guard let close = line.range(of: " resumed>") else { throw TraceError("unreadable line: \(line)") }
                guard let start = unfinished.removeValue(forKey: threadID) else { continue }
                whole = start + line[close.upperBound...]
            }
            if let call = try parseCall(whole, threadID: threadID) { calls.append(call) }
        }
        return calls
    }

    /// Parses one complete line; nil for a call that never returned (`= ?`).
    static func parseCall(_ line: String, threadID: Int) throws(TraceError) -> SystemCall? {
        var scanner = Scanner(Array(line.utf8))
        let name = scanner.take { $0 != UInt8(ascii: "(") }
        guard !name.isEmpty, scanner.skip("(") else { throw TraceError("unreadable line: \(line)") }
        var arguments: [SystemCall.Argument] = []
        scanner.skipSpaces()
        if !scanner.skip(")") {
            while true {
                arguments.append(try scanner.argument(line))
                scanner.skipSpaces()
                if scanner.skip(")") { break }
                guard scanner.skip(",") else { throw TraceError("expected , or ) in: \(line)") }
                scanner.skipSpaces()
            }
        }
        scanner.skipSpaces()
        guard scanner.skip("=") else { throw TraceError("no result in: \(line)") }
        scanner.skipSpaces()
        if scanner.skip("?") { return nil }
        let value = scanner.take { $0 == UInt8(ascii: "-") || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains($0) }
        guard let result = Int64(value) ?? (value.hasPrefix("0x") ? Int64(value.dropFirst(2), radix: 16) : nil) else {
            throw TraceError("unreadable result in: \(line)")
        }
        let resultPath = scanner.peek == UInt8(ascii: "<") ? try scanner.annotation(line) : nil
        return SystemCall(
            threadID: threadID,
            name: String(name),
            arguments: arguments,
            result: result,
            resultPath: resultPath
        )
    }
}

/// A cursor over one line's bytes.
private struct Scanner {
    let bytes: [UInt8]
    var index = 0

    init(_ bytes: [UInt8]) { self.bytes = bytes }

    var peek: UInt8? { index < bytes.count ? bytes[index] : nil }

    mutating func skip(_ text: StaticString) -> Bool {
        let expected = UnsafeBufferPointer(start: text.utf8Start, count: text.utf8CodeUnitCount)
        guard bytes.count - index >= expected.count, bytes[index..<index + expected.count].elementsEqual(expected)
        else { return false }
        index += expected.count
        return true
    }

    mutating func skipSpaces() { while peek == UInt8(ascii: " ") { index += 1 } }

    mutating func take(while keep: (UInt8) -> Bool) -> String {
        let start = index
        while let byte = peek, keep(byte) { index += 1 }
        return String(decoding: bytes[start..<index], as: UTF8.self)
    }

    mutating func argument(_ line: String) throws(TraceError) -> SystemCall.Argument {
        switch peek {
        case UInt8(ascii: "\""):
            let value = try string(line)
            if skip("...") { throw TraceError("a string cut short (raise strace's -s) in: \(line.prefix(200))") }
            return .bytes(value)
        case UInt8(ascii: "["):
            index += 1
            var elements: [SystemCall.Argument] = []
            skipSpaces()
            if skip("]") { return .array(elements) }
            while true {
                elements.append(try argument(line))
                skipSpaces()
                if skip("]") { return .array(elements) }
                guard skip(",") else { throw TraceError("expected , or ] in: \(line.prefix(200))") }
                skipSpaces()
            }
        case UInt8(ascii: "{"):
            index += 1
            var fields: [(String, SystemCall.Argument)] = []
            skipSpaces()
            if skip("}") { return .structure(fields) }
            while true {
                let key = take { $0 != UInt8(ascii: "=") && $0 != UInt8(ascii: ",") && $0 != UInt8(ascii: "}") }
                guard skip("=") else { throw TraceError("expected = in a structure in: \(line.prefix(200))") }
                fields.append((key, try argument(line)))
                skipSpaces()
                if skip("}") { return .structure(fields) }
                guard skip(",") else { throw TraceError("expected , or } in: \(line.prefix(200))") }
                skipSpaces()
            }
        default:
            let word = take {
                $0 != UInt8(ascii: ",") && $0 != UInt8(ascii: ")") && $0 != UInt8(ascii: "]")
                    && $0 != UInt8(ascii: "}") && $0 != UInt8(ascii: "<") && $0 != UInt8(ascii: " ")
            }
            let path = peek == UInt8(ascii: "<") ? try annotation(line) : nil
            _ = skip("(deleted)")  // a descriptor whose file has no name left
            if let value = Int64(word) { return .number(value, path: path) }
            return .word(word, path: path)
        }
    }

    /// A quoted string with `\xHH` and the usual C escapes.
    mutating func string(_ line: String) throws(TraceError) -> [UInt8] {
        index += 1
        var result: [UInt8] = []
        while let byte = peek {
            index += 1
            if byte == UInt8(ascii: "\"") { return result }
            guard byte == UInt8(ascii: "\\") else {
                result.append(byte)
                continue
            }
            guard let escape = peek else { break }
            index += 1
            switch escape {
            case UInt8(ascii: "x"):
                guard index + 2 <= bytes.count,
                    let value = UInt8(String(decoding: bytes[index..<index + 2], as: UTF8.self), radix: 16)
                else { throw TraceError("bad \\x escape in: \(line.prefix(200))") }
                result.append(value)
                index += 2
            case UInt8(ascii: "n"): result.append(10)
            case UInt8(ascii: "t"): result.append(9)
            case UInt8(ascii: "r"): result.append(13)
            case UInt8(ascii: "v"): result.append(11)
            case UInt8(ascii: "f"): result.append(12)
            case UInt8(ascii: "0")...UInt8(ascii: "7"):
                var value = Int(escape - UInt8(ascii: "0"))
                var digits = 1
                while digits < 3, let next = peek, (UInt8(ascii: "0")...UInt8(ascii: "7")).contains(next) {
                    value = value * 8 + Int(next - UInt8(ascii: "0"))
                    index += 1
                    digits += 1
                }
                result.append(UInt8(truncatingIfNeeded: value))
            default: result.append(escape)
            }
        }
        throw TraceError("unterminated string in: \(line.prefix(200))")
    }

    /// `<path>` after a descriptor (hex-escaped with `-xx`, so it holds no raw `>`).
    mutating func annotation(_ line: String) throws(TraceError) -> String {
        index += 1
        var result: [UInt8] = []
        while let byte = peek {
            index += 1
            if byte == UInt8(ascii: ">") { return String(decoding: result, as: UTF8.self) }
            if byte == UInt8(ascii: "\\"), peek == UInt8(ascii: "x"), index + 3 <= bytes.count,
                let value = UInt8(String(decoding: bytes[index + 1..<index + 3], as: UTF8.self), radix: 16)
            {
                result.append(value)
                index += 3
            } else {
                result.append(byte)
            }
        }
        throw TraceError("unterminated <path> in: \(line.prefix(200))")
    }
}
