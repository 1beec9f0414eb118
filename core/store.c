/* kvshim store: placeholder, being implemented. */
