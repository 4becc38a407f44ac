import Foundation

/// A file sent, as the queue carries it.
public struct FileTransfer: Codable, Sendable, Equatable {
    /// The transfer's id.
    public var id: String
    /// The name the receiver gets the file under.
    public var name: String
    /// Its size in bytes, when it was sent.
    public var size: UInt64
    /// What the sender attached.
    public var metadata: [String: String]
    /// Who sent it.
    public var sender: String

    /// Creates a transfer's description.
    public init(id: String, name: String, size: UInt64, metadata: [String: String], sender: String) {
        self.id = id
        self.name = name
        self.size = size
        self.metadata = metadata
        self.sender = sender
    }
}

/// A file received: where it now is, and what came with it.
public struct ReceivedFile: Sendable, Equatable {
    /// The transfer.
    public var transfer: FileTransfer
    /// Where the file is now.
    public var path: String

    /// Creates a received file, as an engine's ``TransferStaging`` delivers it.
    public init(transfer: FileTransfer, path: String) {
        self.transfer = transfer
        self.path = path
    }
}

/// How far a sender's copy has gone.
public struct TransferProgress: Sendable, Equatable {
    /// Bytes copied so far.
    public var bytesCopied: UInt64
    /// The file's size.
    public var totalBytes: UInt64

    /// Creates a progress report, as an engine's ``TransferStaging`` reports it.
    public init(bytesCopied: UInt64, totalBytes: UInt64) {
        self.bytesCopied = bytesCopied
        self.totalBytes = totalBytes
    }
    /// From 0 to 1.
    public var fraction: Double { totalBytes == 0 ? 1 : Double(bytesCopied) / Double(totalBytes) }
}

extension FileTransfer {
    /// The first name, among the transfer's own and `NAME (2).EXT`, `NAME (3).EXT`…, that `isTaken` refuses: where every
    /// engine's staging puts a received file, never over another.
    package func deliveryName(where isTaken: (String) -> Bool) -> String {
        var candidate = name
        var attempt = 1
        while isTaken(candidate) {
            attempt += 1
            let base = (name as NSString).deletingPathExtension
            let suffix = (name as NSString).pathExtension
            candidate = "\(base) (\(attempt))" + (suffix.isEmpty ? "" : "." + suffix)
        }
        return candidate
    }
}
