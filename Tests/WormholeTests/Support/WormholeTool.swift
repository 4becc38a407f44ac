import Foundation
import Synchronization
import WormholeKit
import Testing

/// Runs the package's own executables, built next to the test bundle: the `wormhole` tool for the user's commands,
/// and `WormholeHarness` for the harness's (crash tests, load exercises, benchmark cases).
enum WormholeTool {
    /// The built tool: `$WORMHOLE_EXECUTABLE`, or `wormhole` in the build directory of the tests.
    static let path: String = {
        if let path = ProcessInfo.processInfo.environment["WORMHOLE_EXECUTABLE"] { return path }
        return builtExecutable(named: "wormhole")
    }()

    /// The built harness: `$WORMHOLE_HARNESS`, or `WormholeHarness` in the build directory of the tests.
    static let harnessPath: String = {
        if let path = ProcessInfo.processInfo.environment["WORMHOLE_HARNESS"] { return path }
        return builtExecutable(named: "WormholeHarness")
    }()

    /// The harness's commands; every other command is the tool's.
    static let harnessCommands: Set<String> = [
        "bench", "bench-case", "crash-test", "exercise", "exercise-store", "crash-victim", "bench-peer",
        "bench-peer-store", "bench-case-peer",
    ]

    /// The executable that runs `arguments`.
    static func executable(for arguments: [String]) -> String {
        harnessCommands.contains(arguments.first ?? "") ? harnessPath : path
    }

    private static func builtExecutable(named name: String) -> String {
        let me = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
        var directory = URL(fileURLWithPath: me).deletingLastPathComponent()
        // The test binary sits in PackageTests.xctest (or a .xctest bundle directory); the executables next to it.
        while directory.path != "/" {
            let candidate = directory.appendingPathComponent(name).path
            if FileManager.default.isExecutableFile(atPath: candidate) { return candidate }
            directory = directory.deletingLastPathComponent()
        }
        return "\(name)-executable-not-found"
    }

    struct Result {
        var status: Int32
        var output: String
        var error: String
        var lines: [String] { output.split(separator: "\n").map(String.init) }
    }

    /// Runs `wormhole ARGUMENTS` to its end, with standard input, within `timeout` seconds.
    static func run(_ arguments: [String], input: String? = nil, timeout: Double = 30) throws -> Result {
        let process = try RunningTool(arguments, input: input)
        return process.finish(timeout: timeout)
    }
}

/// A running `wormhole` process whose output is collected as it comes.
final class RunningTool: Sendable {
    private let process: Process
    private let output = Locked(Data())
    private let errorOutput = Locked(Data())
    private let readers = DispatchGroup()

    /// Starts `wormhole ARGUMENTS` (or the harness, for its commands), or with `launcher`,
    /// `LAUNCHER... wormhole ARGUMENTS` (a command such as `unshare` or `setpriv` that runs the tool in another
    /// setting).
    init(
        _ arguments: [String], input: String? = nil, environment: [String: String] = [:], launcher: [String] = []
    ) throws {
        let process = Process()
        let executable = WormholeTool.executable(for: arguments)
        process.executableURL = URL(fileURLWithPath: launcher.first ?? executable)
        process.arguments = launcher.isEmpty ? arguments : Array(launcher.dropFirst()) + [executable] + arguments
        if !environment.isEmpty {
            process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 }
        }
        let outPipe = Pipe()
        let errPipe = Pipe()
        let inPipe = Pipe()
        process.standardOutput = outPipe
        process.standardError = errPipe
        process.standardInput = inPipe
        self.process = process
        try process.run()
        if let input { inPipe.fileHandleForWriting.write(Data(input.utf8)) }
        try inPipe.fileHandleForWriting.close()
        collect(outPipe, isError: false)
        collect(errPipe, isError: true)
    }

    private func collect(_ pipe: Pipe, isError: Bool) {
        readers.enter()
        let handle = pipe.fileHandleForReading
        Thread { [self] in
            while case let chunk = handle.availableData, !chunk.isEmpty {
                if isError { errorOutput.withLock { $0.append(chunk) } } else { output.withLock { $0.append(chunk) } }
            }
            readers.leave()
        }.start()
    }

    var outputSoFar: String { output.withLock { String(decoding: $0, as: UTF8.self) } }
    var errorSoFar: String { errorOutput.withLock { String(decoding: $0, as: UTF8.self) } }
    var outputLines: [String] { outputSoFar.split(separator: "\n").map(String.init) }
    var processIdentifier: Int32 { process.processIdentifier }
    var isRunning: Bool { process.isRunning }

    /// Waits until standard error says the listener is ready.
    func waitUntilListening(timeout: Double = 20) -> Bool { waitForError(containing: "listening to", timeout: timeout) }

    /// Waits until standard error contains `text`.
    func waitForError(containing text: String, timeout: Double = 20) -> Bool {
        eventually(timeout: timeout) { errorSoFar.contains(text) }
    }

    /// Waits for the process to end, killing it after `timeout` seconds.
    func finish(timeout: Double = 30) -> WormholeTool.Result {
        let ended = eventually(timeout: timeout) { !process.isRunning }
        if !ended {
            Foundation.kill(process.processIdentifier, SIGKILL)
            Issue.record("wormhole \(process.arguments ?? []) did not finish within \(timeout) s; killed it")
        }
        process.waitUntilExit()
        _ = readers.wait(timeout: .now() + 10)
        return WormholeTool.Result(status: process.terminationStatus, output: outputSoFar, error: errorSoFar)
    }

    func kill(signal: Int32 = SIGKILL) { Foundation.kill(process.processIdentifier, signal) }
}

extension WormholeTool {
    /// Runs `wormhole ARGUMENTS` with the group root in a fresh directory, as a newcomer's demo runs; returns its
    /// status, its output and the root (removed when the returned directory goes away).
    static func runWithOwnGroupRoot(_ arguments: [String]) throws -> (status: Int32, output: String, root: TemporaryDirectory) {
        let root = TemporaryDirectory()
        let process = Process()
        process.executableURL = URL(fileURLWithPath: path)
        process.arguments = arguments
        process.environment = ProcessInfo.processInfo.environment.merging(["WORMHOLE_APP_GROUPS": root.path]) { $1 }
        let output = Pipe()
        process.standardOutput = output
        try process.run()
        let data = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return (process.terminationStatus, String(decoding: data, as: UTF8.self), root)
    }
}
