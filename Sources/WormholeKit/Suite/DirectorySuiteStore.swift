import Foundation

/// A suite in a directory: one file, `NAME.suite`, written as a mailbox is (two checksummed slots, under a lock),
/// holding a ``SuiteDocument``: the values, the version and a log of the last 64 changes. Observers are woken by the
/// directory's notifier (`suite.NAME`).
final class DirectorySuiteStore: SuiteStore {
    let name: String
    let files: FileTransiting
    let notifier: any Notifier
    let fileName: String
    var notificationName: String { "suite." + name }
    /// How many changes the file's log keeps.
    static let logLimit = 64

    init(name: String, files: FileTransiting, notifier: any Notifier) throws(WormholeError) {
        try MessageIdentifier.validate(name)
        self.name = name
        self.files = files
        self.notifier = notifier
        self.fileName = name + ".suite"
    }

    func document() throws(WormholeError) -> SuiteDocument {
        guard let envelope = try files.read(fileName: fileName, identifier: name) else { return SuiteDocument() }
        return try SuiteDocument(decoding: envelope.payload, suite: name)
    }

    func read() throws(WormholeError) -> SuiteState {
        let document = try document()
        return SuiteState(version: document.version, values: document.values)
    }

    func update(
        sender: String,
        direction: String?,
        _ body: (inout SuiteValues) throws(WormholeError) -> Void
    ) throws(WormholeError) -> SuiteChange? {
        var change: SuiteChange?
        _ = try files.modify(fileName: fileName, identifier: name, sender: sender) { (current) throws(WormholeError) in
            var document =
                try current.map { (data) throws(WormholeError) in try SuiteDocument(decoding: data, suite: name) }
                ?? SuiteDocument()
            var values = document.values
            try body(&values)
            let keys = document.values.changedKeys(comparedTo: values)
            if !keys.isEmpty {
                document.version += 1
                document.values = values
                let entry = SuiteDocument.Entry(
                    version: document.version,
                    keys: keys.sorted(),
                    sender: sender,
                    direction: direction,
                    time: ProcessFacts.wallClockNanoseconds(),
                    values: values.storage.filter { keys.contains($0.key) }
                )
                document.log.append(entry)
                if document.log.count > Self.logLimit { document.log.removeFirst(document.log.count - Self.logLimit) }
                change = SuiteChange(entry: entry)
            }
            return try document.encoded()
        }
        if change != nil { try notifier.post(notificationName) }
        return change
    }

    func changes(after version: UInt64) throws(WormholeError) -> (state: SuiteState, changes: [SuiteChange]?) {
        let document = try document()
        let state = SuiteState(version: document.version, values: document.values)
        guard document.version > version else { return (state, []) }
        let logged = document.log.filter { $0.version > version }
        guard logged.first?.version == version + 1 else { return (state, nil) }
        return (state, logged.map(SuiteChange.init(entry:)))
    }

    func observe(_ handler: @escaping @Sendable () -> Void) throws(WormholeError) -> NotifierObservation {
        try notifier.observe(notificationName, handler: handler)
    }
}
