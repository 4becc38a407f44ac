print("wormhole")
