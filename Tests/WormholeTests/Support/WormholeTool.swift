import Foundation
import Synchronization
import Testing
import WormholeCLI
import WormholeKit

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
        "bench-peer-store", "bench-case-peer", "power-loss", "power-workload", "exercise-postgres-store",
        "stopped-holder", "suspension-check",
    ]

    /// The executable that runs `arguments`.
    static func executable(for arguments: [String]) -> String {
        harnessCommands.contains(arguments.first ?? "") ? harnessPath : path
    }

    private static func builtExecutable(named name: String) -> String {
        #if os(Linux) || os(Android)
        let me =
            (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
        #else
        // On macOS the tests run inside a bundle that another program (xctest, or swiftpm's helper) loads: the
        // package's build directory is found from this file instead, below.
        let me = Bundle.main.executablePath ?? CommandLine.arguments[0]
        #endif
        var directory = URL(fileURLWithPath: me).deletingLastPathComponent()
        // The test binary sits in PackageTests.xctest (or a .xctest bundle directory); the executables next to it.
        while directory.path != "/" {
            let candidate = directory.appendingPathComponent(name).path
            if FileManager.default.isExecutableFile(atPath: candidate) { return candidate }
            directory = directory.deletingLastPathComponent()
        }
        // Tests/WormholeTests/Support/WormholeTool.swift → the package, whose `.build/debug` links to the build.
        let package = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().deletingLastPathComponent()
        for configuration in ["debug", "release"] {
            let candidate = package.appendingPathComponent(".build/\(configuration)/\(name)").path
            if FileManager.default.isExecutableFile(atPath: candidate) { return candidate }
        }
        return "\(name)-executable-not-found"
    }

    struct Result: Sendable {
        var status: Int32
        var output: String
        var error: String
        var lines: [String] { output.split(separator: "\n").map(String.init) }
    }

    /// Runs `wormhole ARGUMENTS` to its end, with standard input and `environment` added to this process's, within
    /// `timeout` seconds.
    static func run(
        _ arguments: [String],
        input: String? = nil,
        environment: [String: String] = [:],
        timeout: Double = 30
    ) throws -> Result {
        let process = try RunningTool(arguments, input: input, environment: environment)
        return process.finish(timeout: timeout)
    }
}

/// A running `wormhole` process whose output is collected as it comes: a ``ChildProcess`` that keeps its lines.
final class RunningTool: Sendable {
    private let child: ChildProcess
    private let output = Locked<[String]>([])
    private let errorOutput = Locked<[String]>([])

    /// Starts `wormhole ARGUMENTS` (or the harness, for its commands), or with `launcher`,
    /// `LAUNCHER... wormhole ARGUMENTS` (a command such as `unshare` or `setpriv` that runs the tool in another
    /// setting).
    init(
        _ arguments: [String],
        input: String? = nil,
        environment: [String: String] = [:],
        launcher: [String] = []
    ) throws {
        let executable = WormholeTool.executable(for: arguments)
        let (output, errorOutput) = (self.output, self.errorOutput)
        child = try ChildProcess(
            executable: launcher.first ?? executable,
            arguments: launcher.isEmpty ? arguments : Array(launcher.dropFirst()) + [executable] + arguments,
            environment: environment,
            input: Data((input ?? "").utf8),
            onErrorLine: { line in errorOutput.withLock { $0.append(line) } }
        ) { line in output.withLock { $0.append(line) } }
    }

    var outputLines: [String] { output.withLock { $0 } }
    var outputSoFar: String { outputLines.map { $0 + "\n" }.joined() }
    var errorSoFar: String { errorOutput.withLock { $0.map { $0 + "\n" }.joined() } }
    var processIdentifier: Int32 { child.processIdentifier }
    var isRunning: Bool { child.isRunning }

    /// Waits until standard error says the listener is ready.
    func waitUntilListening(timeout: Double = 20) -> Bool { waitForError(containing: "listening to", timeout: timeout) }

    /// Waits until standard error contains `text`.
    func waitForError(containing text: String, timeout: Double = 20) -> Bool {
        eventually(timeout: timeout) { errorSoFar.contains(text) }
    }

    /// Waits for the process to end, killing it after `timeout` seconds.
    func finish(timeout: Double = 30) -> WormholeTool.Result {
        let status = child.wait(timeout: timeout, thenSignal: SIGKILL)
        if status == -1 {
            Issue.record("wormhole \(child.arguments) did not finish within \(timeout) s; killed it")
        }
        child.waitForOutput(timeout: 10)
        return WormholeTool.Result(status: status, output: outputSoFar, error: errorSoFar)
    }

    /// Sends the process a signal (SIGKILL by default) and returns at once; ``finish(timeout:)`` collects the rest.
    func kill(signal: Int32 = SIGKILL) { child.send(signal) }
}

extension WormholeTool {
    /// Runs `wormhole ARGUMENTS` with the group root in a fresh directory, as a newcomer's demo runs; returns its
    /// status, its output and the root (removed when the returned directory goes away).
    static func runWithOwnGroupRoot(
        _ arguments: [String]
    ) throws -> (status: Int32, output: String, root: TemporaryDirectory) {
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
