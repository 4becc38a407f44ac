import Foundation
import Synchronization

/// A child process (this same executable by default), whose output lines are handed to callbacks as they come: the
/// tool's demo, the harness's crash tests and benchmarks, and the tests all start their processes with it.
///
/// The lines are read on a thread of their own, never on the cooperative pool.
package final class ChildProcess: Sendable {
    private let process: Process
    private let readiness = DispatchSemaphore(value: 0)
    private let outputEnded = DispatchSemaphore(value: 0)
    private let errorEnded = DispatchSemaphore(value: 0)

    /// The path of the running executable, to start copies of it.
    package static var executablePath: String {
        #if os(Linux)
        if let path = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe") { return path }
        #endif
        return Bundle.main.executablePath ?? CommandLine.arguments[0]
    }

    /// Starts a child process; each line of its standard output goes to `onLine`, and a line equal to `readyLine`
    /// signals ``waitUntilReady(timeout:)``.
    ///
    /// - Parameters:
    ///   - executable: The program; this same executable by default.
    ///   - arguments: Its arguments.
    ///   - environment: Variables added to this process's environment.
    ///   - input: What its standard input reads; nothing (an empty input) by default.
    ///   - onErrorLine: Each line of its standard error; when nil, standard error is passed through.
    package init(
        executable: String? = nil,
        arguments: [String],
        environment: [String: String] = [:],
        input: Data? = nil,
        readyLine: String? = nil,
        onErrorLine: (@Sendable (String) -> Void)? = nil,
        onLine: @escaping @Sendable (String) -> Void
    ) throws {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: executable ?? Self.executablePath)
        process.arguments = arguments
        if !environment.isEmpty {
            process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 }
        }
        let pipe = Pipe()
        process.standardOutput = pipe
        let errorPipe = onErrorLine.map { _ in Pipe() }
        if let errorPipe { process.standardError = errorPipe }
        let inputPipe = input.map { _ in Pipe() }
        if let inputPipe { process.standardInput = inputPipe }
        self.process = process
        try process.run()
        if let input, let inputPipe {
            // A child that does not read its input closes the pipe early: that is not an error of the caller.
            try? inputPipe.fileHandleForWriting.write(contentsOf: input)
            try? inputPipe.fileHandleForWriting.close()
        }
        let (readiness, outputEnded) = (self.readiness, self.outputEnded)
        Self.readLines(from: pipe.fileHandleForReading, ended: outputEnded) { line in
            if line == readyLine { readiness.signal() } else { onLine(line) }
        }
        if let errorPipe, let onErrorLine {
            Self.readLines(from: errorPipe.fileHandleForReading, ended: errorEnded, onLine: onErrorLine)
        } else {
            errorEnded.signal()
        }
    }

    /// Reads lines on a thread of its own until the end of the output, then signals `ended`.
    private static func readLines(
        from reader: FileHandle,
        ended: DispatchSemaphore,
        onLine: @escaping @Sendable (String) -> Void
    ) {
        Thread {
            defer { ended.signal() }
            var pending = Data()
            while true {
                let chunk = reader.availableData
                if chunk.isEmpty { break }
                pending.append(chunk)
                while let newline = pending.firstIndex(of: UInt8(ascii: "\n")) {
                    onLine(String(decoding: pending[pending.startIndex..<newline], as: UTF8.self))
                    pending.removeSubrange(pending.startIndex...newline)
                }
            }
            if !pending.isEmpty { onLine(String(decoding: pending, as: UTF8.self)) }
        }.start()
    }

    /// The child's process id.
    package var processIdentifier: Int32 { process.processIdentifier }

    /// Whether the child is still running.
    package var isRunning: Bool { process.isRunning }

    /// The child's arguments, for messages.
    package var arguments: [String] { process.arguments ?? [] }

    /// Waits until every line the child wrote has been handed over, up to `timeout` seconds in all.
    ///
    /// The output ends when every process holding it has closed it: a grandchild that inherited it keeps it open.
    @discardableResult
    package func waitForOutput(timeout: Double) -> Bool {
        let deadline = DispatchTime.now() + timeout
        return Self.hasEnded(outputEnded, by: deadline) && Self.hasEnded(errorEnded, by: deadline)
    }

    /// Whether a reading thread signalled its end by `deadline`; the signal is given back, so that every later
    /// wait passes at once.
    private static func hasEnded(_ ended: DispatchSemaphore, by deadline: DispatchTime) -> Bool {
        guard ended.wait(timeout: deadline) == .success else { return false }
        ended.signal()
        return true
    }

    /// Waits for the ready line; false on time-out.
    package func waitUntilReady(timeout: Double) -> Bool {
        readiness.wait(timeout: .now() + timeout) == .success
    }

    /// Waits for the child to exit, up to `timeout` seconds; after that, sends it `signal` (SIGTERM by default) and
    /// returns -1. Returns its exit status.
    ///
    /// Every line the child wrote has been handed to the callbacks when this returns: the reading threads may lag
    /// behind the exit on a loaded machine, and a caller that prints what follows must not overtake them. A
    /// grandchild that keeps the output open delays this by at most 10 seconds.
    @discardableResult
    package func wait(timeout: Double, thenSignal signal: Int32 = SIGTERM) -> Int32 {
        let deadline = Date().addingTimeInterval(timeout)
        while process.isRunning && Date() < deadline { usleep(10_000) }
        if process.isRunning {
            Foundation.kill(process.processIdentifier, signal)
            process.waitUntilExit()
            waitForOutput(timeout: 10)
            return -1
        }
        process.waitUntilExit()
        waitForOutput(timeout: 10)
        return process.terminationStatus
    }

    package func terminate() {
        if process.isRunning { process.terminate() }
    }

    /// Kills the child with SIGKILL, then waits until every line it wrote has gone to `onLine`.
    package func kill() {
        send(SIGKILL)
        process.waitUntilExit()
        _ = Self.hasEnded(outputEnded, by: .now() + 10)
    }

    /// Sends the child a signal, and returns at once.
    package func send(_ signal: Int32) {
        Foundation.kill(process.processIdentifier, signal)
    }
}

/// Blocks while the process that started this one lives, keeping `value` (a listener, a consumer) alive: a peer that
/// serves until its benchmark or test ends it exits on its own when that process is gone (killed, crashed), instead
/// of lingering.
///
/// The value is kept here, not by `withExtendedLifetime(value) { waitWhileParentLives() }` around a call that never
/// returns: the end of that lifetime is never reached, so the optimizer may release the value before the call (a
/// release build did: a live listener stopped as soon as it started).
package func waitWhileParentLives<Value>(keeping value: Value) -> Never {
    let parent = getppid()
    while getppid() == parent {
        withExtendedLifetime(value) { _ = sleep(1) }
    }
    exit(0)
}
