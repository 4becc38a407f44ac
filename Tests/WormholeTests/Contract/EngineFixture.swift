import Foundation
import Testing
import WormholeKit
import WormholeTesting

/// The engines every contract suite runs against. An engine added to the package adds a case here, and a branch to
/// ``EngineFixture/wormhole(_:)``: every contract test then runs against it too.
enum EngineKind: String, CaseIterable, Sendable, CustomTestStringConvertible {
    /// ``DirectoryEngine``: each wormhole gets an engine of its own on one directory, as separate processes do.
    case directory
    /// `InMemoryEngine`: every wormhole shares one engine, as processes share a directory.
    case inMemory

    var testDescription: String {
        switch self {
        case .directory: "directory engine"
        case .inMemory: "in-memory engine"
        }
    }
}

/// One test's engine: hands out wormholes that behave as separate processes sharing one place, and a scratch
/// directory for files to send and to receive into. Everything is removed when the fixture goes away.
final class EngineFixture: Sendable {
    let kind: EngineKind
    /// Holds the wormhole's directory (for the directory engine) and the scratch directory.
    let temporary = TemporaryDirectory()
    /// The directory every directory engine of this fixture opens.
    let directory: String
    /// A directory for files to send, and destinations to receive into.
    let scratch: String
    /// The engine every in-memory wormhole of this fixture shares.
    private let inMemory: InMemoryEngine?

    init(_ kind: EngineKind) throws {
        self.kind = kind
        directory = temporary("wormhole")
        scratch = temporary("scratch")
        try FileManager.default.createDirectory(atPath: scratch, withIntermediateDirectories: true)
        inMemory = kind == .inMemory ? InMemoryEngine() : nil
    }

    /// A wormhole sending as `sender`, standing for a process of its own.
    ///
    /// Directory engine: a new ``DirectoryEngine`` on the fixture's directory at each call (its own notifier, file
    /// handles and live connections). In-memory engine: the fixture's one engine.
    func wormhole(_ sender: String) throws -> Wormhole {
        switch kind {
        case .directory: Wormhole(engine: try DirectoryEngine(directory: directory), sender: sender)
        case .inMemory: Wormhole(engine: inMemory!, sender: sender)
        }
    }

    /// A path inside the scratch directory.
    func scratch(_ name: String) -> String { scratch + "/" + name }
}

// MARK: - Helpers of the contract suites

/// The error the contract suites' handlers throw.
struct ContractFailure: Error, CustomStringConvertible {
    var description: String { "contract handler refused" }
}

/// Polls `condition` every 5 ms until it holds or `timeout` seconds pass, suspending instead of blocking a thread of
/// the cooperative pool (which async tests and the tasks they wait for share); returns whether it held.
func eventuallyAwaiting(timeout: Double = 10, _ condition: () throws -> Bool) async rethrows -> Bool {
    let deadline = Date().addingTimeInterval(timeout * sanitizerSlowdown)
    while Date() < deadline {
        if try condition() { return true }
        try? await Task.sleep(for: .milliseconds(5))
    }
    return try condition()
}

/// The result of `task` if it finishes within `timeout` seconds; else the task is cancelled and nil returned.
func result<Success: Sendable>(
    of task: Task<Success, any Error>,
    within timeout: Double = 10
) async -> Result<Success, any Error>? {
    await withTaskGroup(of: Result<Success, any Error>?.self) { group in
        group.addTask { await task.result }
        group.addTask {
            try? await Task.sleep(for: .milliseconds(Int(timeout * sanitizerSlowdown * 1000)))
            return nil
        }
        let first = await group.next() ?? nil
        if first == nil { task.cancel() }  // lets the child that awaits it end
        group.cancelAll()
        return first
    }
}

/// The error of a call expected to throw a ``WormholeError``; records an issue when it returns or throws another
/// error.
func wormholeError(
    sourceLocation: SourceLocation = #_sourceLocation,
    _ body: () throws -> Void
) -> WormholeError? {
    do {
        try body()
        Issue.record("expected a WormholeError, the call returned", sourceLocation: sourceLocation)
    } catch let error as WormholeError {
        return error
    } catch {
        Issue.record("expected a WormholeError, got \(error)", sourceLocation: sourceLocation)
    }
    return nil
}

/// The error of an async call expected to throw a ``WormholeError``; as ``wormholeError(sourceLocation:_:)``.
func wormholeErrorAwaiting(
    sourceLocation: SourceLocation = #_sourceLocation,
    _ body: () async throws -> Void
) async -> WormholeError? {
    do {
        try await body()
        Issue.record("expected a WormholeError, the call returned", sourceLocation: sourceLocation)
    } catch let error as WormholeError {
        return error
    } catch {
        Issue.record("expected a WormholeError, got \(error)", sourceLocation: sourceLocation)
    }
    return nil
}
