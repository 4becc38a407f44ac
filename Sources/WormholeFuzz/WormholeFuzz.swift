import Foundation
import WormholeFuzzing

#if canImport(Glibc)
import Glibc
#endif

/// The fuzzer of every decoder of bytes another process wrote.
///
/// Built with `scripts/fuzz` (`-sanitize=fuzzer,address` and `-D FUZZING`), it is a libFuzzer binary: pass it a
/// corpus directory and libFuzzer's options. Built normally, it replays files (`wormhole-fuzz FILE…`) or writes
/// seed inputs (`wormhole-fuzz --write-seeds DIRECTORY`).
@main
struct WormholeFuzz {
    static func main() {
        #if FUZZING
        var argc = CommandLine.argc
        var argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>? = CommandLine.unsafeArgv
        exit(
            LLVMFuzzerRunDriver(&argc, &argv) { data, size in
                WormholeFuzzing.run(data.map { Array(UnsafeBufferPointer(start: $0, count: size)) } ?? [])
                return 0
            }
        )
        #else
        let arguments = Array(CommandLine.arguments.dropFirst())
        if arguments.first == "--write-seeds", arguments.count == 2 {
            for (name, bytes) in WormholeFuzzing.seeds() {
                _ = FileManager.default.createFile(atPath: arguments[1] + "/" + name, contents: Data(bytes))
            }
            return
        }
        for path in arguments {
            guard let data = FileManager.default.contents(atPath: path) else {
                FileHandle.standardError.write(Data("cannot read \(path)\n".utf8))
                exit(2)
            }
            WormholeFuzzing.run(Array(data))
        }
        print("replayed \(arguments.count) inputs")
        #endif
    }
}

#if FUZZING
/// libFuzzer's driver, for a binary that keeps its own `main` (SwiftPM renames and links an executable's `main`).
@_silgen_name("LLVMFuzzerRunDriver")
func LLVMFuzzerRunDriver(
    _ argc: UnsafeMutablePointer<CInt>,
    _ argv: UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?>,
    _ callback: @convention(c) (UnsafePointer<UInt8>?, Int) -> CInt
) -> CInt
#endif
