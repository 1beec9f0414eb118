/* kvshim keys: placeholder, being implemented. */
